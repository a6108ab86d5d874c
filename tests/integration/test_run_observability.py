"""Seeing and steering real runs, through the real CLI (subprocesses: real Ray, real vLLM, real envs).

One small training run is interrupted with SIGINT after two steps and is then
the material of every test here: the interrupt (message, exit status 130,
checkpoint, no process left), resuming at the next step, a clean console, the
report page in headless Chromium, and replaying its saved batches. A rollout
run gives the report of the other pipeline. The resumed train run and the rollout
run are each sent SIGTERM (the main process alone, as ``timeout -s TERM`` or an
orchestrator does) and must stop as cleanly as on Ctrl-C, with exit status 143.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.readme_runs import SMALL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/frozen_lake.yaml"
NUM_ENVS = 8
#: Replay must reproduce the original trainer metrics within this (same code, same CPU, same batch, same init).
REPLAY_ABS_TOL, REPLAY_REL_TOL = 1e-5, 1e-4
CHROMIUM = "/usr/bin/chromium"


def _cli(*args: str) -> subprocess.Popen:
    # Each run starts its own Ray: never the cluster of this test process (RAY_ADDRESS, set by Ray).
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "roll_async.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"roll-async did not finish within {timeout}s; output:\n{out[-4000:]}"
        )
    return out


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _descendants(root: int) -> set[int]:
    table = _process_table()
    found, frontier = set(), {root}
    while frontier:
        frontier = {
            pid
            for pid, (ppid, _) in table.items()
            if ppid in frontier and pid not in found
        }
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    table = _process_table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """Train until two steps are logged, then SIGINT the whole process group (as Ctrl-C in a terminal does)."""
    run = tmp_path_factory.mktemp("observability") / "train"
    proc = _cli(
        "train",
        CONFIG,
        *SMALL,
        "max_steps=40",
        "logging.save_batches=true",
        "logging.progress_bar=false",
        f"output_dir={run}",
    )
    return _signal_after(
        proc,
        run,
        lambda: len([r for r in _metrics(run) if "train/loss" in r]) >= 2,
        lambda proc: os.killpg(proc.pid, signal.SIGINT),
    )


def test_first_sigint_checkpoints_the_last_completed_step_and_exits_130(
    interrupted_run,
):
    out, run = interrupted_run["out"], interrupted_run["run"]
    assert interrupted_run["rc"] == 130, out[-3000:]
    assert (
        "Traceback" not in out and "Future exception was never retrieved" not in out
    ), out[-3000:]
    match = re.search(
        r"^interrupted at step (\d+) \(SIGINT\); checkpoint at (\S+); resume with: roll-async train (.*)$",
        out,
        re.M,
    )
    assert match, out[-3000:]
    step, checkpoint, command = (
        int(match.group(1)),
        Path(match.group(2)),
        match.group(3),
    )
    assert (
        checkpoint == run / "checkpoints" / f"step_{step - 1}" and checkpoint.is_dir()
    )
    assert f"checkpoint.resume_from={run}" in command and f"output_dir={run}" in command
    logged = [r["step"] for r in _metrics(run) if "train/loss" in r]
    # the checkpoint is of the last completed step, never an older one
    assert step - 1 >= max(logged)


def test_no_process_is_left_after_the_interrupt(interrupted_run):
    assert interrupted_run["children"], (
        "the run should have started Ray and vLLM processes"
    )
    assert not interrupted_run["left"], (
        f"processes left: {sorted(interrupted_run['left'])}"
    )


def test_resume_continues_at_the_next_step_and_sigterm_checkpoints_it_and_exits_143(
    interrupted_run,
):
    """The resumed run is also the SIGTERM case: one run less on a shared machine."""
    run = interrupted_run["run"]
    step = int(
        re.search(r"^interrupted at step (\d+)", interrupted_run["out"], re.M).group(1)
    )
    before = len(_metrics(run))

    def new_steps() -> list[int]:
        return [r["step"] for r in _metrics(run)[before:] if "train/loss" in r]

    proc = _cli(
        "train",
        CONFIG,
        *SMALL,
        "max_steps=40",
        "logging.progress_bar=false",
        f"output_dir={run}",
        f"checkpoint.resume_from={run}",
    )
    result = _terminate_after(proc, run, lambda: bool(new_steps()))
    resumed = new_steps()
    assert resumed == list(range(step, step + len(resumed))), (
        f"interrupted at step {step}; the resumed run logged steps {resumed}"
    )
    _assert_clean_stop(result)
    match = _the_interrupt_line(
        result["out"],
        "step",
        r"interrupted at step (\d+) \(SIGTERM\); checkpoint at (\S+); resume with: roll-async train (.*)",
    )
    stopped, checkpoint = int(match.group(1)), Path(match.group(2))
    assert (
        checkpoint == run / "checkpoints" / f"step_{stopped - 1}"
        and checkpoint.is_dir()
    )
    assert f"checkpoint.resume_from={run}" in match.group(3)
    assert stopped - 1 >= max(resumed)


def test_console_shows_step_lines_and_no_vllm_or_ray_warnings(interrupted_run):
    out, run = interrupted_run["out"], interrupted_run["run"]
    noise = [
        line
        for line in out.splitlines()
        if re.search(
            r"WARNING (vllm|ray)|\(VLLMEngine|\(EnvManagerWorker|\(GroupQueueActor|pid=\d+\)|Failed to load weights"
            r"|worker\.py|raylet|Token authentication|(WARNING|INFO) \d\d-\d\d \d\d:\d\d:\d\d \[",
            line,
        )
    ]
    assert not noise, "\n".join(noise[:20])
    assert re.search(r"^step 0: reward ", out, re.M)
    worker_logs = list((run / "logs").glob("ray-worker-*.log"))
    assert (run / "logs" / "driver.log").is_file() and worker_logs
    assert any("vllm" in p.read_text(errors="replace").lower() for p in worker_logs), (
        "the engine's log should be in RUN_DIR/logs"
    )


def test_trajectories_carry_per_turn_timestamps(interrupted_run):
    lines = (interrupted_run["run"] / "trajectories.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert (
        record["episode_requested_at"]
        <= record["started_at"]
        <= record["finished_at"]
        <= record["served_at"]
    )
    turn = record["turns"][0]
    assert (
        record["started_at"]
        <= turn["generate_started_at"]
        <= turn["generate_finished_at"]
        <= turn["env_step_started_at"]
    )
    assert (
        turn["env_step_started_at"]
        <= turn["env_step_finished_at"]
        <= record["finished_at"]
    )


def test_replay_reproduces_the_trainer_metrics_on_the_saved_batches(
    interrupted_run, tmp_path
):
    run = interrupted_run["run"]
    saved = sorted(
        int(p.stem.split("_")[1]) for p in (run / "batches").glob("step_*.pt")
    )
    original = {
        r["step"]: r for r in _metrics(run) if "train/loss" in r and r["step"] in saved
    }
    assert len(original) >= 2
    replay_dir = tmp_path / "replay"
    proc = _cli(
        "train",
        str(run / "config.yaml"),
        f"replay.from={run}",
        f"max_steps={max(original) + 1}",
        f"output_dir={replay_dir}",
        "checkpoint.resume_from=null",
        "logging.progress_bar=false",
    )
    out = _finish(proc, timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert not list((replay_dir / "logs").glob("ray-worker-*.log")), (
        "replay must not start Ray workers or engines"
    )
    replayed = {r["step"]: r for r in _metrics(replay_dir) if "train/loss" in r}
    for step, metrics in original.items():
        keys = [
            k
            for k, v in metrics.items()
            if k.startswith("train/") and isinstance(v, (int, float))
        ]
        assert keys
        for key in keys:
            assert replayed[step][key] == pytest.approx(
                metrics[key], abs=REPLAY_ABS_TOL, rel=REPLAY_REL_TOL
            ), (step, key)


# -- the report in a real browser ---------------------------------------------------------


def _chromium_page_check(report: Path, tmp_path: Path) -> dict:
    """Load the report in headless Chromium; return rendered row count, span counts and console errors."""
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it as root with apt: apt-get install chromium)"
        )
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (the test extra)"
    )
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(  # a fresh, empty profile directory per test
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            viewport={"width": 1400, "height": 900},
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page()
            page.on(
                "console",
                lambda m: (
                    errors.append(m.text) if m.type in ("error", "warning") else None
                ),
            )
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "request",
                lambda r: (
                    errors.append(f"network request: {r.url}")
                    if not r.url.startswith(("file:", "data:", "about:"))
                    else None
                ),
            )
            page.goto(report.as_uri())
            page.wait_for_selector("body[data-rendered='1']", timeout=60_000)
            result = {
                "rows": page.locator("#timeline g.env-row").count(),
                "data_rows": page.get_attribute("#timeline", "data-rows"),
                "generate_spans": page.locator("#timeline rect.span-generate").count(),
                "env_step_spans": page.locator("#timeline rect.span-env-step").count(),
                "charts": page.locator("#curves svg.chart").count(),
                "staleness_bars": page.locator(
                    "#staleness-histogram rect.staleness-bar"
                ).count(),
                "browser_rows": page.locator("#traj-table tbody tr").count(),
            }
            page.locator("#traj-table tbody tr").first.click()
            result["generated_segments"] = page.locator(
                "#traj-detail .seg-generated"
            ).count()
        finally:
            browser.close()
    result["errors"] = errors
    return result


def _report(run: Path) -> Path:
    proc = _cli("report", str(run), "--trace")
    out = _finish(proc, timeout=300)
    assert proc.returncode == 0, out
    assert json.loads((run / "trace.json").read_text())["traceEvents"]
    return run / "report.html"


@pytest.mark.browser
def test_report_of_a_train_run_renders_in_chromium(interrupted_run, tmp_path):
    page = _chromium_page_check(_report(interrupted_run["run"]), tmp_path)
    assert page["errors"] == []
    assert page["rows"] == NUM_ENVS and page["data_rows"] == str(NUM_ENVS)
    assert page["generate_spans"] > 0 and page["env_step_spans"] > 0
    assert (
        page["charts"] >= 3 and page["staleness_bars"] >= 1 and page["browser_rows"] > 0
    )
    assert page["generated_segments"] > 0


@pytest.fixture(scope="module")
def rollout_run(tmp_path_factory) -> dict:
    """A rollout run stopped by SIGTERM after its first batch (one run serves the report test too)."""
    run = tmp_path_factory.mktemp("observability") / "rollout"
    proc = _cli("rollout", CONFIG, *SMALL, "num_batches=40", f"output_dir={run}")
    return _terminate_after(proc, run, lambda: bool(_metrics(run)))


@pytest.mark.browser
def test_report_of_a_rollout_run_renders_in_chromium(rollout_run, tmp_path):
    page = _chromium_page_check(_report(rollout_run["run"]), tmp_path)
    assert page["errors"] == []
    assert page["rows"] == NUM_ENVS
    assert page["generate_spans"] > 0 and page["browser_rows"] > 0


def _terminate_after(
    proc: subprocess.Popen, run: Path, done: Callable[[], bool]
) -> dict:
    """SIGTERM the main process alone (as ``timeout -s TERM``, ``kill PID`` or an orchestrator do) once ``done()``."""
    return _signal_after(proc, run, done, lambda proc: proc.send_signal(signal.SIGTERM))


def _signal_after(
    proc: subprocess.Popen,
    run: Path,
    done: Callable[[], bool],
    send: Callable[[subprocess.Popen], None],
) -> dict:
    """``send`` the run its signal once ``done()``; its exit, output and the processes it left behind."""
    seen: set[int] = set()
    deadline = time.monotonic() + 1500
    while not done():
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended before the signal (exit {proc.returncode}):\n{proc.stdout.read()[-4000:]}"
            )
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the run did not get far enough within 1500 s")
        seen |= _descendants(proc.pid)
        time.sleep(1.0)
    seen |= _descendants(proc.pid)
    send(proc)
    out = _finish(proc, timeout=300)
    deadline = time.monotonic() + 60
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(1.0)
    return {
        "run": run,
        "rc": proc.returncode,
        "out": out,
        "left": _alive(seen),
        "children": seen,
    }


def _assert_clean_stop(result: dict) -> None:
    out = result["out"]
    assert result["rc"] == 143, out[-3000:]
    for noise in (
        "Traceback",
        "Future exception was never retrieved",
        "SystemExit",
        "CancelledError",
        "ActorUnavailableError",
        "*** SIGTERM received",
    ):
        assert noise not in out, out[-3000:]
    assert result["children"], "the run should have started Ray and vLLM processes"
    assert not result["left"], f"processes left: {sorted(result['left'])}"


def _the_interrupt_line(out: str, what: str, pattern: str) -> re.Match:
    """The run printed exactly one ``interrupted at {what}`` line, and it reads as ``pattern``."""
    lines = re.findall(rf"^interrupted at {what} .*$", out, re.M)
    assert len(lines) == 1, out[-3000:]
    match = re.fullmatch(pattern, lines[0])
    assert match, out[-3000:]
    return match


def test_sigterm_stops_a_rollout_run_cleanly_and_exits_143(rollout_run):
    result = rollout_run
    run = result["run"]
    _assert_clean_stop(result)
    match = _the_interrupt_line(
        result["out"],
        "batch",
        r"interrupted at batch (\d+) \(SIGTERM\); (\d+) batches kept in (\S+); collect the rest with: roll-async rollout (.*)",
    )
    assert int(match.group(2)) == len(_metrics(run)) >= 1
    assert Path(match.group(3)) == run
    assert f"num_batches={40 - int(match.group(2))}" in match.group(4)
