"""``configs/verifiers_qa.yaml`` trains 2 steps on the session's real engine, for each verifiers API.

verifiers 0.3.1 (the classic API, in the venv) runs here in-process. verifiers 0.4.0 (``verifiers.v1``, in
``.venv/verifiers-0.4``, see test_env_verifiers_v1.py) cannot share a process with 0.3.1, so its run is a
second Ray driver in a subprocess with 0.4.0 first on its path (and its Ray workers'), joined to this
session's Ray instance and given the same engine actor by name: still one engine. The random-init tiny model
seldom answers right, so the checks are on what must hold: whole batches, a finite loss, rising weight
versions, every episode played without env_error, the rubric's reward as the episode reward and its
per-function scores in metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from tests.integration.short_runs import IN_PROCESS
from tests.integration.test_train_pipeline import fresh_weights  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

pytest.importorskip("verifiers")

REPO = Path(__file__).resolve().parents[2]
TAG = "VerifiersQA"
V1_TARGET = Path(
    os.environ.get("ROLL_ASYNC_VERIFIERS_V1") or Path(sys.prefix) / "verifiers-0.4"
)
OVERRIDES = [
    "max_steps=2",
    *IN_PROCESS,
    f"custom_envs.{TAG}.max_tokens_per_step=8",
]
#: The v1 run's env: the v1 test taskset, two turns per episode.
V1_ENV_TYPE = "verifiers:roll_async.testing.verifiers_v1_taskset"
V1_ENV_CONFIG = {"taskset": {"num_rows": 8, "turns": 2}}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_run(run: Path) -> None:
    metrics = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] >= 0]
    assert [m["step"] for m in metrics] == [0, 1]
    versions = [m["weight_version"] for m in metrics]
    assert versions[1] == versions[0] + 1
    assert all(m["train/loss"] is not None for m in metrics), metrics
    for m in metrics:
        assert {
            f"env/{TAG}/episode_reward",
            f"env/{TAG}/rubric_correct",
            f"env/{TAG}/rubric_replied",
        } <= set(m), sorted(m)
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 8
    for t in trajectories:
        assert t["stop_reason"] != "env_error", t.get("error")
        scores = t["metrics"]
        assert t["episode_reward"] == pytest.approx(
            scores["rubric_correct"] + 0.5 * scores["rubric_replied"]
        )
        assert scores["agent_segment_breaks"] == 0.0


@pytest.mark.timeout(300)
async def test_the_classic_api_config_trains_two_steps(engine, tmp_path, fresh_weights):  # noqa: F811
    from roll_async.envs.adapters.verifiers_env import verifiers_api

    if verifiers_api("test") != "legacy":
        pytest.skip("the venv's verifiers is >= 0.4")
    config = load_config(
        REPO / "configs" / "verifiers_qa.yaml", [f"output_dir={tmp_path}", *OVERRIDES]
    )
    run = await AgenticPipeline(config, engines=[engine]).run()
    check_run(run)


@pytest.mark.timeout(300)
async def test_the_v1_api_trains_two_steps_in_a_second_driver(
    engine,
    tmp_path,
    fresh_weights,  # noqa: F811
):
    if not (V1_TARGET / "verifiers" / "v1").is_dir():
        pytest.skip(f"verifiers 0.4 is not installed in {V1_TARGET} (scripts/setup.sh)")
    import ray

    context = ray.get_runtime_context()
    args = {
        "address": context.gcs_address,
        "namespace": context.namespace,
        "engine": "test_engine_0",
        "pythonpath": os.pathsep.join([str(V1_TARGET), str(REPO)]),
        "config": str(REPO / "configs" / "verifiers_qa.yaml"),
        "overrides": [
            f"output_dir={tmp_path}",
            *OVERRIDES,
            f"custom_envs.{TAG}.env_type={V1_ENV_TYPE}",
        ],
        "env_configs": {TAG: V1_ENV_CONFIG},
    }
    env = {**os.environ, "PYTHONPATH": args["pythonpath"]}
    done = subprocess.run(
        [sys.executable, "-m", "roll_async.testing.second_driver", json.dumps(args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    check_run(Path(done.stdout.strip().splitlines()[-1]))
