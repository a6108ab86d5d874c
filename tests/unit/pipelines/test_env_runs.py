"""A run tells docker swe tags its id (their containers' label) and sweeps and counts what they left at its end."""

from __future__ import annotations

import pytest

from roll_async.config.schema import CustomEnvConfig, EnvManagerConfig, PipelineConfig
from roll_async.envs.swe import env as swe_env
from roll_async.pipelines.env_runs import end_env_runs, label_env_runs, new_run_id


def _config() -> PipelineConfig:
    return PipelineConfig(
        custom_envs={
            "Docker": CustomEnvConfig(env_type="swe", env_config={"runtime": "docker"}),
            "Named": CustomEnvConfig(
                env_type="swe",
                env_config={"runtime": "docker", "runtime_config": {"run_id": "mine"}},
            ),
            "Local": CustomEnvConfig(env_type="swe", env_config={"runtime": "local"}),
            "Other": CustomEnvConfig(env_type="countdown"),
        },
        train_env_manager=EnvManagerConfig(tags=["Docker", "Named", "Local", "Other"]),
    )


def test_docker_tags_get_the_run_id_and_the_end_sweeps_each_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config()
    run_id = new_run_id("train-sync-1")
    assert run_id.startswith("train-sync-1-") and run_id != new_run_id("train-sync-1")
    label_env_runs(config, run_id)
    envs = config.custom_envs
    assert envs["Docker"].env_config["runtime_config"] == {"run_id": run_id}
    assert envs["Named"].env_config["runtime_config"] == {"run_id": "mine"}
    assert "runtime_config" not in envs["Local"].env_config
    assert envs["Other"].env_config == {}
    swept: list[tuple[str, str]] = []

    def sweep(kind: str, run: str) -> int:
        swept.append((kind, run))
        return 2 if run == "mine" else 0

    monkeypatch.setattr(swe_env, "sweep_run", sweep)
    assert end_env_runs(config, run_id) == {"workspace/containers_leaked": 2.0}
    assert sorted(swept) == [("docker", "mine"), ("docker", run_id)]


def test_a_failing_sweep_does_not_hide_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(kind: str, run: str) -> int:
        raise OSError("no daemon")

    monkeypatch.setattr(swe_env, "sweep_run", broken)
    assert end_env_runs(_config(), "r") == {}
