"""Chaos soak: one async training run (real Ray, two CPU vLLM replicas, every env in its own process) under a
seeded schedule of every contained fault, then checks from the run directory that no fault path is left.

The schedule (``Fault``: kind and step) is drawn from ``--seed`` and validated before any actor starts.
Faults: ``env_raise``, ``env_hang`` (past ``env_step_timeout_s``) and ``env_segfault`` go through the test
hook of the ``faulty`` env (``trigger_dir``: the soak drops ``<n>.<fault>`` there, the next env step claims
and injects it); ``worker_kill`` is ``kill -9`` of an EnvManagerWorker process (pid from the scheduler's
``describe()``); ``connection_drop`` replaces the queue actor's call socket (``drop_queue_connections``), so
every worker's hand-over connection drops while the queue lives; ``replica_kill`` is ``kill -9`` of one engine
replica's process tree (one always survives); ``sigterm`` signals the run's main process, which must checkpoint
and exit 143, and the soak resumes it with ``checkpoint.resume_from``. The run itself is a child process
(``--child``) running ``AgenticPipeline`` with an injector task beside it, so SIGTERM reaches a real run's main
process. Checks (``check_run``): every step logged once, groups served at most once and whole, every created
group served, pending, dropped or filtered (counted per step), staleness within the bound, and each injected
fault counted under its own metric. Results: ``benchmarks/results/chaos_cpu_seed<S>.{json,md}``.

    python -m benchmarks.chaos --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from benchmarks.common import ResultFiles, add_output_args, device_kind

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "benchmarks" / "configs" / "chaos.yaml"
FaultKind = Literal[
    "env_raise",
    "env_hang",
    "env_segfault",
    "worker_kill",
    "connection_drop",
    "replica_kill",
    "sigterm",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
#: Env faults -> the faulty env's fault names (the suffix of a trigger file).
ENV_FAULTS = {"env_raise": "raise", "env_hang": "hang", "env_segfault": "segfault"}
#: Faults that take a step of their own (a kill would swallow the error of an env fault in flight).
SOLO_FAULTS = ("worker_kill", "replica_kill", "sigterm")
#: How each env fault reads in an env_error trajectory's error text.
ENV_ERROR_TEXT = {
    "env_raise": "injected fault",
    "env_hang": "exceeded env_step_timeout_s",
    "env_segfault": "SIGSEGV",
}


class SoakConfigError(ValueError):
    """A soak config or schedule that cannot run; the message names the key."""


@dataclass(frozen=True)
class Fault:
    """One injection: ``kind`` once the run has logged step ``step - 1`` (during step ``step``'s rollout)."""

    kind: FaultKind
    step: int


@dataclass
class SoakConfig:
    seed: int = 1
    max_steps: int = 16
    #: Faults per kind (``draw_counts`` draws the env faults' and drops' from the seed).
    counts: dict[str, int] = field(
        default_factory=lambda: {
            "env_raise": 1,
            "env_hang": 1,
            "env_segfault": 1,
            "worker_kill": 1,
            "connection_drop": 1,
            "replica_kill": 1,
            "sigterm": 1,
        }
    )
    #: Logged steps after a fault before the next solo fault or the end (its error reaches the metrics).
    quiet_steps: int = 4
    num_replicas: int = 2
    max_worker_restarts: int = 3
    max_staleness: int = 1
    env_step_timeout_s: float = 5.0
    #: Seconds a phase (the run up to SIGTERM, the resumed run) may take.
    phase_timeout_s: float = 1500.0


def draw_counts(seed: int) -> dict[str, int]:
    """1 or 2 of each env fault and of connection drops, one of each kill and one SIGTERM."""
    rng = random.Random(seed)
    counts = {kind: 1 for kind in FAULT_KINDS}
    for kind in ("env_raise", "env_hang", "env_segfault", "connection_drop"):
        counts[kind] = rng.randint(1, 2)
    return counts


def steps_needed(config: SoakConfig) -> int:
    """The fewest steps that hold the schedule: one per fault, quiet steps before the SIGTERM and at the end."""
    faults = sum(n for k, n in config.counts.items() if k != "sigterm")
    sigterm = 1 + 1 + config.quiet_steps if config.counts.get("sigterm") else 0
    # twice the quiet steps at the end: the run does not wait for a last fault's error, the soak leaves it time
    return 1 + faults + sigterm + 2 * config.quiet_steps


def draw_schedule(config: SoakConfig) -> list[Fault]:
    """One fault per step in a seeded order: faults before the SIGTERM at steps 1.., the rest after the resume."""
    rng = random.Random(config.seed)
    kinds = [
        k for k, n in sorted(config.counts.items()) if k != "sigterm" for _ in range(n)
    ]
    rng.shuffle(kinds)
    faults: list[Fault] = []
    if config.counts.get("sigterm", 0):
        before = rng.randint(1, max(1, len(kinds) - 1)) if kinds else 0
        for i, kind in enumerate(kinds[:before]):
            faults.append(Fault(kind, 1 + i))  # type: ignore[arg-type]
        sigterm_step = before + config.quiet_steps + 1
        faults.append(Fault("sigterm", sigterm_step))
        for i, kind in enumerate(kinds[before:]):
            faults.append(Fault(kind, sigterm_step + 2 + i))  # type: ignore[arg-type]
    else:
        faults = [Fault(kind, 1 + i) for i, kind in enumerate(kinds)]  # type: ignore[arg-type]
    return faults


def validate_schedule(config: SoakConfig, faults: list[Fault]) -> None:
    """Before any actor starts: an unknown kind, a step out of range or a budget the run cannot meet fails here."""
    for kind in config.counts:
        if kind not in FAULT_KINDS:
            raise SoakConfigError(
                f"counts.{kind}: unknown fault kind; use one of {list(FAULT_KINDS)}"
            )
    for i, fault in enumerate(faults):
        if fault.kind not in FAULT_KINDS:
            raise SoakConfigError(
                f"faults[{i}].kind={fault.kind!r}: unknown fault kind; use one of {list(FAULT_KINDS)}"
            )
        if not 1 <= fault.step <= config.max_steps - 1 - config.quiet_steps:
            raise SoakConfigError(
                f"faults[{i}].step={fault.step}: more faults than steps allow; a fault needs a step >= 1 and "
                f"{config.quiet_steps} quiet steps after it within max_steps={config.max_steps} (raise max_steps)"
            )
    kinds = Counter(f.kind for f in faults)
    if kinds["replica_kill"] > config.num_replicas - 1:
        raise SoakConfigError(
            f"counts.replica_kill={kinds['replica_kill']}: at most num_replicas - 1 = {config.num_replicas - 1} "
            "replicas may be killed (one must survive)"
        )
    if kinds["worker_kill"] > config.max_worker_restarts:
        raise SoakConfigError(
            f"counts.worker_kill={kinds['worker_kill']}: more than max_worker_restarts={config.max_worker_restarts}"
        )
    if kinds["sigterm"] > 1:
        raise SoakConfigError(
            f"counts.sigterm={kinds['sigterm']}: one SIGTERM and resume per soak"
        )
    by_step: dict[int, list[str]] = defaultdict(list)
    for fault in faults:
        by_step[fault.step].append(fault.kind)
    for step, on_step in sorted(by_step.items()):
        if len(on_step) > 1 and any(k in SOLO_FAULTS for k in on_step):
            raise SoakConfigError(
                f"faults: step {step} holds {on_step}; a kill or SIGTERM takes a step of its own"
            )
    sigterm = [f.step for f in faults if f.kind == "sigterm"]
    for i, fault in enumerate(faults):
        if sigterm and fault.kind != "sigterm":
            # before: its error is logged before the signal; after: the resumed run has logged a step first
            if not (
                fault.step + config.quiet_steps < sigterm[0]
                or fault.step > sigterm[0] + 1
            ):
                raise SoakConfigError(
                    f"faults[{i}].step={fault.step}: too close to the SIGTERM at step {sigterm[0]} "
                    f"(needs {config.quiet_steps} quiet steps before it, one after the resume)"
                )


# -- the run (child process) ----------------------------------------------------------------


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if "train/loss" in record:
            steps.append(int(record["step"]))
    return steps


def _record(run_dir: Path, entry: dict[str, Any]) -> None:
    with (run_dir / "chaos_injections.jsonl").open("a") as f:
        f.write(json.dumps({**entry, "at": time.time()}) + "\n")


def _last_injection_at(run_dir: Path) -> float:
    path = run_dir / "chaos_injections.jsonl"
    if not path.exists():
        return 0.0
    return max(
        (
            json.loads(line)["at"]
            for line in path.read_text().splitlines()
            if line.strip()
        ),
        default=0.0,
    )


def _settled(run_dir: Path, settle_s: float) -> bool:
    """A step was logged (trained) at least ``settle_s`` after the last injection."""
    due = _last_injection_at(run_dir) + settle_s
    rows = _jsonl(run_dir / "metrics.jsonl")
    return any(r.get("timestamp/train_end", 0.0) >= due for r in rows)


def _kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and its descendants (what a crash or the OOM killer does); the pids killed."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    killed = []
    for proc in procs:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return killed


async def inject(
    pipeline: Any,
    faults: list[Fault],
    run_dir: Path,
    trigger_dir: Path,
    seed: int,
    settle_s: float,
) -> None:
    """The injector beside the pipeline: each fault once the run has logged the step before it."""
    rng = random.Random(seed * 7919 + len(faults))
    pending = sorted(faults, key=lambda f: f.step)
    last_env_fault = 0.0
    for index, fault in enumerate(pending):
        while (
            not _logged_steps(run_dir) or max(_logged_steps(run_dir)) < fault.step - 1
        ):
            await asyncio.sleep(0.5)
        scheduler = pipeline.train_scheduler
        entry: dict[str, Any] = {"kind": fault.kind, "step": fault.step}
        if fault.kind in ENV_FAULTS:
            name = f"{fault.step:03d}_{index:02d}.{ENV_FAULTS[fault.kind]}"
            (trigger_dir / name).write_text("")
            entry["trigger"] = name
            last_env_fault = time.monotonic()
        elif fault.kind == "connection_drop":
            entry["dropped"] = await scheduler.drop_queue_connections()
        elif fault.kind == "worker_kill":
            # an env fault in flight on the killed worker would end as lost_to_restart, not counted as its kind
            await asyncio.sleep(max(0.0, last_env_fault + settle_s - time.monotonic()))
            described = await scheduler.describe()
            workers = [w for w in described["workers"] if isinstance(w, dict)]
            victim = rng.choice(workers)
            os.kill(
                int(victim["pid"]), signal.SIGKILL
            )  # the worker alone; its env processes see it go
            entry.update(worker_index=victim["worker_index"], pids=[int(victim["pid"])])
        elif fault.kind == "replica_kill":
            await asyncio.sleep(max(0.0, last_env_fault + settle_s - time.monotonic()))
            live = list(pipeline.fleet.live_indices)
            replica = rng.choice(live)
            pid = await pipeline.engines[replica].__ray_call__.remote(
                lambda self: os.getpid()
            )
            entry.update(replica=replica, pids=_kill_tree(int(pid)))
        _record(run_dir, entry)


def prepare_trigger_dir(run_dir: Path) -> Path:
    """``RUN_DIR/chaos_triggers`` with its ``claimed/``, emptied of triggers an earlier phase left unclaimed."""
    trigger_dir = run_dir / "chaos_triggers"
    (trigger_dir / "claimed").mkdir(parents=True, exist_ok=True)
    for stale in trigger_dir.glob("*.*"):
        if stale.is_file():
            stale.unlink()
    return trigger_dir


def soak_pipeline_config(trigger_dir: Path, overrides: list[str]) -> Any:
    """The soak's PipelineConfig (``benchmarks/configs/chaos.yaml`` + overrides), env faults read from ``trigger_dir``."""
    from roll_async.config.loading import load_config

    config = load_config(str(CONFIG), overrides)
    config.custom_envs["Chaos"].env_config["trigger_dir"] = str(trigger_dir)
    return config


def run_child(args: argparse.Namespace) -> int:
    """One phase of the soak's run: the pipeline (as ``roll-async train``) with the injector beside it."""
    from roll_async.pipelines.agentic_pipeline import AgenticPipeline
    from roll_async.pipelines.interrupt import (
        RunInterrupted,
        SignalReceived,
        exit_status,
    )

    run_dir = Path(args.run_dir)
    plan = json.loads((run_dir / "chaos_schedule.json").read_text())
    faults = [Fault(**f) for f in plan["faults"]]
    soak = SoakConfig(**plan["soak"])
    sigterm = [f.step for f in faults if f.kind == "sigterm"]
    if args.phase == 1:
        mine = [
            f
            for f in faults
            if f.kind != "sigterm" and (not sigterm or f.step < sigterm[0])
        ]
    else:
        mine = [f for f in faults if f.kind != "sigterm" and f.step > sigterm[0]]
    trigger_dir = prepare_trigger_dir(run_dir)
    config = soak_pipeline_config(trigger_dir, plan["overrides"] + args.overrides)

    async def main() -> None:
        pipeline = AgenticPipeline(config)
        injector = asyncio.create_task(
            inject(
                pipeline,
                mine,
                run_dir,
                trigger_dir,
                soak.seed * 10 + args.phase,
                soak.env_step_timeout_s + 3.0,
            )
        )
        try:
            await pipeline.run(handle_signals=True)
        finally:
            injector.cancel()
            (outcome,) = await asyncio.gather(injector, return_exceptions=True)
            if isinstance(
                outcome, Exception
            ):  # shows as a fault injected short of its plan
                _record(run_dir, {"kind": "injector_error", "error": repr(outcome)})

    try:
        asyncio.run(main())
    except RunInterrupted as stop:
        print(
            f"{stop}; resume with: checkpoint.resume_from={stop.run_dir}",
            file=sys.stderr,
            flush=True,
        )
        return exit_status(stop.signal_name)
    except SignalReceived as stop:
        print(f"interrupted ({stop}) before the first step", file=sys.stderr)
        return exit_status(str(stop))
    return 0


# -- the soak (parent process) --------------------------------------------------------------


def _start_phase(
    run_dir: Path, phase: int, overrides: list[str], log
) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            "--child",
            "--run-dir",
            str(run_dir),
            "--phase",
            str(phase),
            *overrides,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(proc: subprocess.Popen, timeout: float, what: str) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"{what} did not finish within {timeout:.0f}s") from None


def run_soak(
    soak: SoakConfig, faults: list[Fault], run_dir: Path, extra: list[str] | None = None
) -> dict[str, Any]:
    """Run both phases (the SIGTERM and the resume) and check the run directory; the summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"seed={soak.seed}",
        f"max_steps={soak.max_steps}",
        f"max_staleness={soak.max_staleness}",
        f"engine.num_replicas={soak.num_replicas}",
        f"train_env_manager.env_step_timeout_s={soak.env_step_timeout_s}",
        f"train_env_manager.max_worker_restarts={soak.max_worker_restarts}",
        f"output_dir={run_dir}",
        *(extra or []),
    ]
    (run_dir / "chaos_schedule.json").write_text(
        json.dumps(
            {
                "soak": dataclasses.asdict(soak),
                "faults": [dataclasses.asdict(f) for f in faults],
                "overrides": overrides,
            },
            indent=1,
        )
    )
    sigterm = [f.step for f in faults if f.kind == "sigterm"]
    started = time.monotonic()
    phases: list[dict[str, Any]] = []
    with (run_dir / "chaos_console.log").open("w") as log:
        proc = _start_phase(run_dir, 1, [], log)
        if sigterm:
            deadline = time.monotonic() + soak.phase_timeout_s
            settle_s = soak.env_step_timeout_s + 3.0
            while (
                not _logged_steps(run_dir)
                or max(_logged_steps(run_dir)) < sigterm[0] - 1
                # an env fault's error (a hang's after its timeout) must reach a logged step before the signal
                or not _settled(run_dir, settle_s)
            ):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the run ended (exit {proc.returncode}) before the SIGTERM at step {sigterm[0]}; "
                        f"see {run_dir / 'chaos_console.log'}"
                    )
                if time.monotonic() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    raise RuntimeError(
                        f"step {sigterm[0] - 1} not logged within {soak.phase_timeout_s:.0f}s"
                    )
                time.sleep(0.5)
            os.kill(
                proc.pid, signal.SIGTERM
            )  # the main process alone, as an orchestrator does
            _record(run_dir, {"kind": "sigterm", "step": sigterm[0], "pid": proc.pid})
            rc = _wait(proc, 600, "the run after SIGTERM")
            log.flush()
            match = re.search(
                r"checkpoint at (\S+?); resume with",
                (run_dir / "chaos_console.log").read_text(errors="replace"),
            )
            phases.append(
                {
                    "phase": 1,
                    "rc": rc,
                    "s": time.monotonic() - started,
                    # checked now: later checkpoints may prune it (checkpoint.keep_last)
                    "checkpoint": match.group(1) if match else None,
                    "checkpoint_saved": bool(match and Path(match.group(1)).is_dir()),
                }
            )
            log.flush()
            proc = _start_phase(run_dir, 2, [f"checkpoint.resume_from={run_dir}"], log)
        rc = _wait(proc, soak.phase_timeout_s, f"phase {len(phases) + 1} of the run")
        phases.append(
            {"phase": len(phases) + 1, "rc": rc, "s": time.monotonic() - started}
        )
    wall_s = time.monotonic() - started
    summary = check_run(run_dir, soak, faults, phases)
    summary["wall_s"] = round(wall_s, 1)
    return summary


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return records


def check_run(
    run_dir: Path, soak: SoakConfig, faults: list[Fault], phases: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every check of the soak from the run directory; ``failures`` lists the ones that did not hold."""
    import yaml

    failures: list[str] = []
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    group_size = int(config["train_env_manager"]["group_size"])
    batch_size = int(config["rollout_batch_size"])
    rows = [r for r in _jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
    served = _jsonl(run_dir / "trajectories.jsonl")
    unserved = _jsonl(run_dir / "unserved_trajectories.jsonl")
    injections = _jsonl(run_dir / "chaos_injections.jsonl")
    console_log = run_dir / "chaos_console.log"
    console = console_log.read_text(errors="replace") if console_log.exists() else ""
    sigterm = [f.step for f in faults if f.kind == "sigterm"]

    # -- the run finished its steps, each once (after the SIGTERM and resume)
    steps = [r["step"] for r in rows]
    if steps != list(range(soak.max_steps)):
        failures.append(
            f"logged steps {steps} are not 0..{soak.max_steps - 1}, each once"
        )
    resume_step = None
    if sigterm:
        match = re.search(
            r"interrupted at step (\d+) \(SIGTERM\); checkpoint at (\S+?);", console
        )
        if phases[0]["rc"] != 143 or match is None:
            failures.append(
                f"SIGTERM: exit {phases[0]['rc']} (want 143) or no checkpoint line"
            )
        else:
            resume_step = int(match.group(1))
            if not phases[0].get("checkpoint_saved", Path(match.group(2)).is_dir()):
                failures.append(f"SIGTERM: checkpoint {match.group(2)} missing")
    if phases[-1]["rc"] != 0:
        failures.append(f"the last phase exited {phases[-1]['rc']}")

    # -- groups served at most once and whole; staleness within the bound
    by_group: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in served:
        by_group[t["group_id"]].append(t)
    for gid, members in by_group.items():
        served_steps = {t["served_step"] for t in members}
        if len(served_steps) != 1:
            failures.append(f"group {gid} served at steps {sorted(served_steps)}")
        if len(members) != group_size:
            failures.append(
                f"group {gid} served with {len(members)} of {group_size} trajectories"
            )
    traj_ids = Counter(t["traj_id"] for t in served)
    if any(n > 1 for n in traj_ids.values()):
        failures.append(
            f"trajectories served twice: {[k for k, n in traj_ids.items() if n > 1][:5]}"
        )
    per_step = Counter(t["served_step"] for t in served)
    if any(per_step.get(s, 0) != batch_size for s in steps):
        failures.append(
            f"trajectories per step {dict(sorted(per_step.items()))}, want {batch_size} each"
        )
    staleness = [t["served_step"] - t["created_step"] for t in served]
    if any(not 0 <= s <= soak.max_staleness for s in staleness):
        failures.append(
            f"staleness out of [0, {soak.max_staleness}]: max {max(staleness)}"
        )
    if any(r.get("rollout/staleness/max", 0) > soak.max_staleness for r in rows):
        failures.append("rollout/staleness/max above max_staleness on some step")

    # -- none lost: per run segment, every created group is served, pending, dropped or filtered, each counted
    lost = 0
    segments = [[r for r in rows if resume_step is None or r["step"] < resume_step]]
    if resume_step is not None:
        segments.append([r for r in rows if r["step"] >= resume_step])
    accounted: dict[str, float] = Counter()
    for segment in segments:
        created = served_groups = dropped = 0.0
        for r in segment:
            created += r.get("rollout/created_groups", 0)
            served_groups += per_step.get(r["step"], 0) / group_size
            for key in (
                "rollout/dropped_stale_groups",
                "rollout/filtered_groups",
                "rollout/dropped_error_groups",
            ):
                dropped += r.get(key, 0)
                accounted[key] += r.get(key, 0)
            pending = r.get("rollout/pending_groups", 0)
            gap = created - served_groups - dropped - pending
            if gap != 0:
                lost += abs(gap)
                failures.append(
                    f"step {r['step']}: {created:g} groups created, {served_groups:g} served, {dropped:g} dropped, "
                    f"{pending:g} pending: {gap:g} unaccounted"
                )
        accounted["created"] += created
        accounted["served"] += served_groups
        if segment:
            accounted["pending_at_segment_end"] += segment[-1].get(
                "rollout/pending_groups", 0
            )

    # -- every injected fault counted under its own metric
    def total(key: str, segment: list[dict[str, Any]] | None = None) -> float:
        return float(sum(r.get(key, 0) for r in (rows if segment is None else segment)))

    claimed = {p.name for p in (run_dir / "chaos_triggers" / "claimed").glob("*.*")}
    env_errors = [u for u in unserved if u["fate"] == "env_error"]
    faults_out: dict[str, dict[str, Any]] = {}
    injected = Counter(e["kind"] for e in injections)
    for kind in FAULT_KINDS:
        planned = sum(f.kind == kind for f in faults)
        if not planned:
            continue
        row: dict[str, Any] = {"planned": planned, "injected": injected[kind]}
        if kind in ENV_FAULTS:
            mine = [e for e in injections if e["kind"] == kind]
            row["injected"] = sum(e["trigger"] in claimed for e in mine)
            row["counted"] = sum(
                ENV_ERROR_TEXT[kind] in (u.get("error") or "") for u in env_errors
            )
            row["metric"] = (
                "rollout/env_errors (error text: " + ENV_ERROR_TEXT[kind] + ")"
            )
        elif kind == "worker_kill":
            row["counted"] = int(total("rollout/worker_restarts"))
            row["episodes_lost_to_restart"] = int(
                total("rollout/episodes_lost_to_restart")
            )
            row["metric"] = "rollout/worker_restarts"
        elif kind == "connection_drop":
            row["counted"] = int(total("rollout/transport_reconnects"))
            row["metric"] = "rollout/transport_reconnects (one per worker connection)"
        elif kind == "replica_kill":
            counted = 0
            for segment in segments:
                segment_kills = [
                    e
                    for e in injections
                    if e["kind"] == kind
                    and segment
                    and segment[0]["step"] < e["step"] <= segment[-1]["step"]
                ]
                if segment and segment_kills:
                    last = segment[-1]
                    want_live = soak.num_replicas - len(segment_kills)
                    if last.get("engine/live_replicas") == want_live and last.get(
                        "router/dead_replicas"
                    ) == len(segment_kills):
                        counted += len(segment_kills)
            row["counted"] = counted
            row["metric"] = "engine/live_replicas, router/dead_replicas"
        elif kind == "sigterm":
            row["counted"] = int(
                phases[0]["rc"] == 143
                and resume_step is not None
                and phases[-1]["rc"] == 0
            )
            row["metric"] = "exit 143, checkpoint, resumed to the last step"
        row["survived"] = row["injected"] == planned and (
            row["counted"] >= planned
            if kind == "connection_drop"
            else row["counted"] == planned
        )
        if not row["survived"]:
            failures.append(
                f"{kind}: planned {planned}, injected {row['injected']}, counted {row['counted']}"
            )
        faults_out[kind] = row
    env_error_metric = total("rollout/env_errors")
    want_env_errors = sum(
        faults_out[k]["injected"] for k in ENV_FAULTS if k in faults_out
    )
    if env_error_metric != want_env_errors or len(env_errors) != want_env_errors:
        failures.append(
            f"rollout/env_errors={env_error_metric:g}, env_error records {len(env_errors)}, env faults injected "
            f"{want_env_errors}"
        )
    return {
        "ok": not failures,
        "failures": failures,
        "faults": faults_out,
        "groups_lost": lost,
        "groups": dict(accounted),
        "steps": len(steps),
        "resume_step": resume_step,
        "phases": phases,
        "env_errors": env_error_metric,
        "unserved_fates": dict(Counter(u["fate"] for u in unserved)),
        "run_dir": str(run_dir),
    }


def markdown(summary: dict[str, Any], soak: SoakConfig, faults: list[Fault]) -> str:
    lines = [
        f"# Chaos soak, seed {soak.seed}",
        "",
        f"{'PASS' if summary['ok'] else 'FAIL'}: {summary['steps']} async steps (max_staleness={soak.max_staleness}, "
        f"{soak.num_replicas} replicas, isolation: process), SIGTERM and resume at step {summary['resume_step']}, "
        f"wall {summary['wall_s']:.0f} s, groups lost {summary['groups_lost']:g}.",
        "",
        "Schedule: "
        + ", ".join(f"{f.kind}@{f.step}" for f in sorted(faults, key=lambda f: f.step)),
        "",
        "| fault | planned | injected | counted | survived | metric |",
        "|---|---|---|---|---|---|",
    ]
    for kind, row in summary["faults"].items():
        lines.append(
            f"| {kind} | {row['planned']} | {row['injected']} | {row['counted']} | "
            f"{'yes' if row['survived'] else 'NO'} | {row['metric']} |"
        )
    groups = summary["groups"]
    lines += [
        "",
        f"Groups: {groups.get('created', 0):g} created, {groups.get('served', 0):g} served, "
        f"{groups.get('rollout/dropped_stale_groups', 0):g} dropped stale, "
        f"{groups.get('rollout/filtered_groups', 0):g} filtered, "
        f"{groups.get('rollout/dropped_error_groups', 0):g} dropped for errors, "
        f"{groups.get('pending_at_segment_end', 0):g} pending at a segment's last step; unserved episodes by fate: "
        f"{summary['unserved_fates']}.",
    ]
    if summary["failures"]:
        lines += ["", "Failures:", *(f"- {f}" for f in summary["failures"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="default: the fewest steps the schedule needs",
    )
    parser.add_argument(
        "--run-dir",
        default=None,
        help="the run directory (default runs/chaos-seed<S>-<time>)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phase", type=int, default=1, help=argparse.SUPPRESS)
    add_output_args(parser, name_default=None)
    args, overrides = parser.parse_known_args(argv)
    args.overrides = overrides
    if args.child:
        return run_child(args)
    soak = SoakConfig(seed=args.seed, counts=draw_counts(args.seed))
    soak.max_steps = args.max_steps or steps_needed(soak)
    faults = draw_schedule(soak)
    try:
        validate_schedule(soak, faults)
    except SoakConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    name = args.name or f"chaos_{device_kind()}_seed{soak.seed}"
    files = ResultFiles.claim(name, [".json", ".md"], overwrite=args.overwrite)
    run_dir = Path(
        args.run_dir
        or REPO / "runs" / f"chaos-seed{soak.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    summary = run_soak(soak, faults, run_dir, overrides)
    payload = {
        "seed": soak.seed,
        "soak": dataclasses.asdict(soak),
        "schedule": [dataclasses.asdict(f) for f in faults],
        **summary,
    }
    files.write_json(payload)
    files.write_text(".md", markdown(summary, soak, faults))
    print(markdown(summary, soak, faults))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
