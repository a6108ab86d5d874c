"""benchmarks.swe_rollout: the scripted episodes are reproducible and solve their tasks, and a tiny run of all
three schedulers on real workspaces writes its files (local runtime; docker when ROLL_ASYNC_REQUIRE_DOCKER=1)."""

from __future__ import annotations

import json
import os

import pytest

import benchmarks.common as common
from benchmarks import swe_rollout
from benchmarks.swe_policy import PlanConfig, WorkspaceLedger, plan_episode
from roll_async.envs.swe.env import SweConfig, load_tasks
from roll_async.testing.workspace_runtimes import skip_reason

TASKS = ["roll-async__calc_add", "roll-async__upper_file"]


def test_plans_are_seeded_end_in_submit_and_fit_the_turns() -> None:
    tasks = load_tasks(SweConfig(task_format="swe", action_format="text"))
    config = PlanConfig()
    lengths = set()
    for seed in range(40):
        task = tasks[seed % len(tasks)]
        plan = plan_episode(task, seed, seed % 3, config, max_turns=8)
        assert plan == plan_episode(task, seed, seed % 3, config, max_turns=8)
        assert plan.replies[-1].endswith("```bash\nsubmit\n```")
        assert any(task.solution.rstrip() in r for r in plan.replies)
        assert 2 <= len(plan.replies) <= 8
        lengths.add(len(plan.replies))
    assert len(lengths) >= 3  # detours vary the episode length
    one = plan_episode(tasks[0], 5, 0, config, 16)
    assert one != plan_episode(tasks[0], 5, 1, config, 16)  # group members differ


def test_ledger_cuts_spans_at_the_window() -> None:
    ledger = WorkspaceLedger()
    ledger.add("exec", 0.0, 2.0)
    ledger.add("exec", 3.0, 4.0)
    ledger.add("verifier", 5.0, 9.0)
    assert ledger.seconds("exec", (1.0, 3.5)) == pytest.approx(1.5)
    assert ledger.seconds("verifier", (1.0, 6.0)) == pytest.approx(1.0)
    assert ledger.count("exec", (2.5, 10.0)) == 1


def _runtime() -> str:
    if os.environ.get("ROLL_ASYNC_REQUIRE_DOCKER") == "1":
        assert swe_rollout.docker_answers(), (
            "ROLL_ASYNC_REQUIRE_DOCKER=1 but no daemon answers"
        )
        return "docker"
    reason = skip_reason("local")
    if reason is not None:
        pytest.skip(reason)
    return "local"


@pytest.mark.slow  # real workspaces: containers under docker (CI), ~10 s
def test_a_tiny_run_of_every_scheduler_writes_its_files(
    tmp_path, monkeypatch, tiny_model_path
) -> None:
    runtime = _runtime()
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    # machine_info imports vllm for its version (~9 s); the machine record is not what this test checks
    machine = {"cpu_count": os.cpu_count(), "cpu_model": "test"}
    monkeypatch.setattr(common, "machine_info", lambda: machine)
    argv = ["--runtime", runtime, "--task-ids", *TASKS, "--num-env-groups", "1"]
    argv += ["--group-size", "2", "--num-batches", "1", "--repeats", "1"]
    argv += ["--max-turns", "2", "--time-scale", "50", "--think-words", "2"]
    argv += ["--pool-size", "0", "--model", str(tiny_model_path), "--name", "tiny"]
    assert swe_rollout.main(argv) == 0
    result = json.loads((tmp_path / "tiny.json").read_text())
    assert result["runtime"] == runtime and result["machine"]["cpu_count"]
    runs = result["runs"]
    assert sorted(r["scheduler"] for r in runs) == sorted(swe_rollout.SCHEDULERS)
    for run in runs:
        # the reference solution is played on every episode, so every one is solved
        assert run["trajectories"] == 2 and run["success_rate"] == 1.0, run
        assert run["errors"] == 0 and 0 < run["container_busy_fraction"] <= 1
        assert sum(run["slot_share"].values()) == pytest.approx(1.0)
        assert run["seconds"]["verifier"] > 0 and run["seconds"]["exec"] > 0
    assert set(result["summary"]["vs_barrier"]) == {"per_env", "first_complete"}
    assert "first_complete ÷ barrier" in (tmp_path / "tiny.md").read_text()
    with pytest.raises(SystemExit, match="--overwrite"):
        swe_rollout.main(argv)
