"""How the README's and docs' commands run for real through the CLI (subprocesses: real Ray, vLLM, envs, trainer).

Every ``roll-async train|rollout|export|check-model|report`` command the docs show, and
``bash scripts/main.sh``, runs end to end in ``test_readme_commands.py`` (the main job and what is
done with it) and ``test_readme_configs.py`` (the other runs), shortened only by overrides (one step or one
batch, validation off, 8 envs, a small engine cache, a short SFT warm start). ``COVERAGE`` maps
each documented command to the test that runs it; ``tests/unit/project/test_readme.py`` fails (fast) when
the docs show a command that is not in it. Placeholders are filled in: ``RUN_DIR`` is the main
job's run, ``/path/to/hf-model`` its export (a Hugging Face model directory like any other).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Each run's own wall-clock limit (Ray + vLLM start-up is most of a run on a loaded 2-core machine).
RUN_TIMEOUT_S = 600
#: 2 groups x 4 envs = 8 env instances, a small engine cache (the machine is shared); every real CLI run.
SMALL = [
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "engine.cpu_kv_cache_space_gib=0.5",
    "engine.max_num_seqs=16",
    "ray_num_cpus=4",
    "trainer.micro_batch_size=8",
]
#: One step, no validation, SMALL; the same for every documented train run.
SHORT = ["max_steps=1", "eval_steps=0", *SMALL, "logging.progress_bar=false"]
#: The main job's SFT warm start, shortened (its configs warm-start; the path still runs).
SHORT_SFT = ["sft_warmup.steps=2", "sft_warmup.num_demos=8"]
#: ``--check`` commands are the check itself: the fast tier runs each through the CLI.
CHECKED = (
    "tests/unit/project/test_readme.py::test_each_documented_command_passes_the_check"
)
#: The two modules running the commands (split so the suite's two workers share them).
MAIN_JOB = "tests/integration/test_readme_commands.py"
CONFIGS = "tests/integration/test_readme_configs.py"

#: Each command the docs show (whitespace collapsed, ``.venv/bin/`` dropped) -> the test running it.
#: Commands sharing a test are one CLI invocation once shortened: the tour's ``train configs/default.yaml
#: max_steps=5 output_dir=runs/tour`` is what ``bash scripts/main.sh`` runs (main.sh sets up the venv and
#: execs ``roll-async train configs/default.yaml "$@"``), likewise the async pair; and
#: ``configs/default.yaml`` is ``demo_learn_frozen_lake.yaml`` plus validation, so with ``SHORT``
#: (validation off) the learning demo's commands resolve to the main job's config, which
#: ``tests/unit/project/test_readme.py::test_the_learning_demo_commands_shortened_are_the_main_job`` checks.
COVERAGE: dict[str, str] = {
    "bash scripts/main.sh": f"{MAIN_JOB}::test_main_job_trains_one_step_and_checkpoints",
    "roll-async train configs/default.yaml max_steps=5 output_dir=runs/tour": f"{MAIN_JOB}::test_main_job_trains_one_step_and_checkpoints",
    "roll-async report runs/tour": f"{MAIN_JOB}::test_report_of_the_main_job",
    "roll-async report RUN_DIR": f"{MAIN_JOB}::test_report_of_the_main_job",
    "roll-async export RUN_DIR --out DIR": f"{MAIN_JOB}::test_export_then_check_model_on_the_export",
    "roll-async export RUN_DIR [--step K] --out DIR": f"{MAIN_JOB}::test_export_of_a_named_step",
    "roll-async check-model /path/to/hf-model --temperature 0.7 --top-p 0.9": f"{MAIN_JOB}::test_export_then_check_model_on_the_export",
    "roll-async train configs/sokoban.yaml model.path=/path/to/hf-model": f"{MAIN_JOB}::test_train_on_your_own_model",
    "roll-async train configs/demo_learn_frozen_lake.yaml": f"{MAIN_JOB}::test_main_job_trains_one_step_and_checkpoints",
    "bash scripts/main.sh mode=async max_staleness=1": f"{CONFIGS}::test_main_job_async",
    "roll-async train configs/default.yaml mode=async max_staleness=1": f"{CONFIGS}::test_main_job_async",
    "roll-async train configs/demo_learn_frozen_lake.yaml mode=async max_staleness=1": f"{CONFIGS}::test_main_job_async",
    "roll-async rollout configs/sokoban.yaml": f"{CONFIGS}::test_rollout_sokoban",
    "roll-async train configs/agent_frozen_lake.yaml": f"{CONFIGS}::test_agent_config_trains",
    "roll-async train configs/default.yaml trainer.strategy=fsdp2 trainer.num_ranks=2": f"{CONFIGS}::test_fsdp2_on_two_ranks",
    "roll-async train configs/sokoban.yaml --check": CHECKED,
    "roll-async train CONFIG --check": CHECKED,
    "roll-async rollout configs/gymnasium_frozen_lake.yaml --check": CHECKED,
    "roll-async rollout configs/gem_guess_the_number.yaml --check": CHECKED,
    "roll-async rollout configs/openenv_guess.yaml --check": CHECKED,
    "roll-async train configs/verifiers_qa.yaml --check": CHECKED,
    "roll-async train configs/agent_frameworks.yaml --check": CHECKED,
    "roll-async train configs/swe_local.yaml --check": CHECKED,
    "roll-async train configs/agent_swe.yaml --check": CHECKED,
    # in-process on the zoo engine the tool configs share, 2 steps (the docs' max_steps=3, shortened)
    "roll-async train configs/swe.yaml max_steps=3": "tests/integration/test_tool_configs_train.py::test_swe_config_trains_in_containers_and_leaves_none",
}


def run_env() -> dict[str, str]:
    # Each run starts its own Ray: never the cluster of this test process (RAY_ADDRESS, set by Ray).
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["ROLL_ASYNC_VENV"] = sys.prefix  # scripts/main.sh: this interpreter's venv
    env["ROLL_ASYNC_NO_CHROMIUM"] = "1"  # scripts/setup.sh: no apt install from a test
    return env


def run_command(*argv: str) -> tuple[str, float]:
    """Run ``argv`` from the repository root; its output (stdout and stderr) and wall time. Fails on exit != 0."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran past {RUN_TIMEOUT_S} s:\n{out[-4000:]}")
    wall = time.monotonic() - started
    print(f"{' '.join(argv[:4])} ...: {wall:.1f} s")  # shown with -s / on failure
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{out[-4000:]}"
    )
    assert "Traceback" not in out, out[-4000:]
    return out, wall


def cli(*args: str) -> str:
    return run_command(sys.executable, "-m", "roll_async.cli", *args)[0]


def metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def assert_trained(out: str, run: Path, steps: int = 1) -> list[dict]:
    """One step line per step on the console, train/loss per step in metrics.jsonl, the last step's checkpoint."""
    assert re.search(r"^step 0: reward ", out, re.M), out[-3000:]
    trained = [m for m in metrics(run) if "train/loss" in m]
    assert [m["step"] for m in trained] == list(range(steps)), metrics(run)
    assert (run / "checkpoints" / f"step_{steps - 1}").is_dir()
    assert f"run directory: {run}" in out
    return trained


def setup_is_a_no_op() -> bool:
    """Whether scripts/setup.sh would leave this venv alone: its stamp matches (the hash setup.sh writes).

    Otherwise main.sh would reinstall the venv from inside a test (minutes, network): a venv not made by
    setup.sh, or one older than pyproject.toml / constraints.txt. scripts/test.sh runs setup.sh first.
    """
    stamp = Path(sys.prefix) / ".roll_async_stamp"
    device = os.environ.get("ROLL_ASYNC_DEVICE", "cpu")
    inputs = ["pyproject.toml"] + (["constraints.txt"] if device == "cpu" else [])
    digest = hashlib.sha256(b"".join((REPO / n).read_bytes() for n in inputs))
    return stamp.is_file() and stamp.read_text().strip() == (
        f"{device} {digest.hexdigest()[:16]}"
    )


def main_sh(*overrides: str) -> str:
    """``bash scripts/main.sh`` when its set-up is a no-op; otherwise the command main.sh execs after it."""
    if setup_is_a_no_op():
        return run_command("bash", "scripts/main.sh", *overrides)[0]
    print("scripts/setup.sh would reinstall this venv: running what main.sh execs")
    return cli("train", "configs/default.yaml", *overrides)
