"""Env grouping benchmark: per-env async loops vs a per-turn barrier baseline vs the engine ceiling.

For every workload and every grid point (num_env_groups x group_size x
max_env_num_per_worker) of a YAML config, the schedulers run back to back on
ONE engine, with the same env classes, configs, seeds, prompt building and
sampling params:

* ``per_env``: the real rollout path, mode async (env loops never wait on a
  trainer; ``max_staleness`` defaults to the number of batches, so no group is
  ever dropped). With ``transport: ray`` this is RolloutScheduler +
  GroupQueueManager actor + EnvManagerWorker actors calling the engine actor;
  with ``transport: inprocess`` it is LocalRolloutScheduler in this process.
* ``per_env_sync``: the same, mode sync (loops pause at every get_batch): no
  per-turn barrier, but no overlap between batches either.
* ``per_env_first_complete``: ``per_env`` with ``serve_order: first_complete``
  (the first complete groups are served; slow groups continue into later
  batches within the staleness bound, so no env idles behind them).
* ``barrier``: ``benchmarks.barrier_rollout.BarrierRollout``, the NeMo-RL /
  RAGEN / legacy VAGEN loop, in the driver, calling the same engine (the same
  Ray actor handle, or the same in-process VLLMEngine).
* ``replay``: ``benchmarks.replay_rollout.ReplayRollout``: the latest
  ``per_env`` run's own engine requests (same prompts, growth, lengths and
  concurrency) sent again by bare loops in the driver, with no envs, tokenizer,
  scheduler or workers. per_env ÷ replay is what the rollout machinery costs;
  replay ÷ ceiling is what the multi-turn request pattern itself does to the
  engine. Needs ``per_env`` listed before it; replays no env latency.

After every repeat the engine ceiling (``benchmarks.engine_ceiling.measure``)
is measured on the same engine at the grid point's concurrency and the mean
prompt/output lengths its requests had. Over Ray, the driver's loops (barrier,
replay, ceiling) run at the Ray workers' niceness and the rollout's scheduling
policy, as the per-env workers do (``treat_driver_like_workers``). Results (JSON, CSV, markdown, PNG
unless ``--no-plots``) go to ``benchmarks/results/<--name>.*`` (default
``env_grouping_<cpu|gpu>_<config name>``), stamped with the machine and the
command; an existing file is never replaced without ``--overwrite``. Ratios are
only meaningful within one run.

    python -m benchmarks.env_grouping                      # quick mode (CPU, tiny model, < 10 min)
    python -m benchmarks.env_grouping --config benchmarks/configs/grouping_full.yaml --model /models/Qwen2.5-7B-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import inspect
import json
import logging
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import process_cpu
from benchmarks.common import (
    ResultFiles,
    add_output_args,
    device_kind,
    spread,
)
from benchmarks.grouping_stats import (
    BatchWindow,
    EngineSample,
    mean_request_shape,
    summarize_run,
)
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import REQUEST_TRANSPORTS
from roll_async.runtime import sched_policy
from roll_async.trajectory import Trajectory

logger = logging.getLogger("benchmarks.env_grouping")

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
QUICK_CONFIG = CONFIG_DIR / "grouping_quick.yaml"
FULL_CONFIG = CONFIG_DIR / "grouping_full.yaml"
SCHEDULERS = ("per_env", "per_env_sync", "per_env_first_complete", "barrier", "replay")
#: A workload's schedulers when its YAML names none.
DEFAULT_SCHEDULERS = ("per_env", "barrier")
TRANSPORTS = ("ray", "inprocess")


# -- the benchmark config ------------------------------------------------------------------


@dataclass
class GridPoint:
    num_env_groups: int
    group_size: int
    max_env_num_per_worker: int
    #: Trajectories per get_batch; default num_env_groups * group_size (one barrier round).
    rollout_batch_size: int | None = None
    #: Batches per scheduler at this point (default: the workload's, else the config's num_batches).
    num_batches: int | None = None
    #: Schedulers at this point (default: the workload's).
    schedulers: list[str] | None = None

    @property
    def num_envs(self) -> int:
        return self.num_env_groups * self.group_size

    @property
    def batch_size(self) -> int:
        return self.rollout_batch_size or self.num_envs

    @property
    def label(self) -> str:
        return f"{self.num_env_groups}x{self.group_size} W{self.max_env_num_per_worker}"


@dataclass
class Workload:
    name: str
    custom_envs: dict[str, Any]
    grid: list[GridPoint]
    description: str = ""
    schedulers: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEDULERS))
    num_groups_partition: list[int] = field(default_factory=list)
    ceiling: bool = True
    num_batches: int | None = None
    sequence_length: int | None = None
    #: Run every scheduler this many times (ABBA order) and pool the runs (more trajectories, less noise).
    repeats: int = 1

    @property
    def tags(self) -> list[str]:
        return list(self.custom_envs)


@dataclass
class BenchConfig:
    name: str
    workloads: list[Workload]
    transport: str = "ray"
    model: str | None = None
    seed: int = 42
    sequence_length: int = 768
    num_batches: int = 3
    #: per_env (async) staleness bound; null: num_batches (no group is ever dropped as stale).
    max_staleness: int | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)
    env_step_timeout_s: float = 120.0
    ceiling_rounds: int = 2
    sample_interval_s: float = 0.05
    #: Seconds the fresh per-env worker processes get to settle before timing (see run_per_env); 0: none.
    per_env_warmup_s: float = 1.0
    ray_num_cpus: int | None = None
    #: train_env_manager.rollout_sched_policy of the per-env workers and queue; over Ray the driver's rollout
    #: loops (barrier, replay, ceiling, get_batch) run under the same policy, so every row gets the same treatment.
    rollout_sched_policy: str = "batch"
    description: str = ""


def _grid(spec: Any) -> list[GridPoint]:
    """A list of points, or a dict of lists (cartesian product, first key outermost)."""
    if isinstance(spec, dict):
        keys = list(spec)
        points: list[dict[str, Any]] = [{}]
        for key in keys:
            values = spec[key] if isinstance(spec[key], list) else [spec[key]]
            points = [{**p, key: v} for p in points for v in values]
        return [GridPoint(**p) for p in points]
    return [GridPoint(**dict(p)) for p in spec]


def load_bench_config(path: str | Path) -> BenchConfig:
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or "workloads" not in raw:
        raise ValueError(f"{path}: a benchmark config needs a 'workloads' list")
    workloads = []
    for entry in raw.pop("workloads"):
        entry = dict(entry)
        grid = _grid(entry.pop("grid"))
        unknown = [s for s in entry.get("schedulers", []) if s not in SCHEDULERS]
        if unknown:
            raise ValueError(
                f"{path}: workload {entry.get('name')}: unknown schedulers {unknown}; choose from {SCHEDULERS}"
            )
        for point in grid:
            unknown += [s for s in point.schedulers or [] if s not in SCHEDULERS]
        if unknown:
            raise ValueError(
                f"{path}: workload {entry.get('name')}: unknown schedulers {unknown}; choose from {SCHEDULERS}"
            )
        for point in grid:
            schedulers = list(
                point.schedulers or entry.get("schedulers") or DEFAULT_SCHEDULERS
            )
            if "replay" in schedulers and (
                "per_env" not in schedulers
                or schedulers.index("per_env") > schedulers.index("replay")
            ):
                raise ValueError(
                    f"{path}: workload {entry.get('name')} point {point.label}: schedulers {schedulers}: 'replay' replays "
                    "the per_env run's requests, so list 'per_env' before it"
                )
        workloads.append(Workload(grid=grid, **entry))
    bench = BenchConfig(workloads=workloads, **raw)
    if bench.transport not in TRANSPORTS:
        raise ValueError(
            f"{path}: transport={bench.transport!r}; use one of {TRANSPORTS}"
        )
    return bench


def pipeline_config(
    bench: BenchConfig, workload: Workload, point: GridPoint, scheduler: str
) -> Any:
    """The PipelineConfig one scheduler run uses (validated like any pipeline config)."""
    from omegaconf import OmegaConf

    from roll_async.config.schema import PipelineConfig, validate_config

    num_batches = point.num_batches or workload.num_batches or bench.num_batches
    per_worker = (
        point.max_env_num_per_worker if bench.transport == "ray" else point.num_envs
    )
    mode = "sync" if scheduler == "per_env_sync" else "async"
    data: dict[str, Any] = {
        "mode": mode,
        "max_staleness": None
        if mode == "sync"
        else (bench.max_staleness or max(1, num_batches)),
        "rollout_batch_size": point.batch_size,
        "sequence_length": workload.sequence_length or bench.sequence_length,
        "num_batches": num_batches,
        "seed": bench.seed,
        "model": {"path": bench.model},
        "engine": dict(bench.engine),
        "generation": dict(bench.generation),
        "custom_envs": workload.custom_envs,
        "train_env_manager": {
            "num_env_groups": point.num_env_groups,
            "group_size": point.group_size,
            "tags": workload.tags,
            "num_groups_partition": list(workload.num_groups_partition),
            "max_env_num_per_worker": point.max_env_num_per_worker,
            # one thread per env, so sync env steps never queue for a thread (the barrier does the same)
            "env_threads_per_worker": max(8, per_worker),
            "env_step_timeout_s": bench.env_step_timeout_s,
            "watchdog_timeout_s": max(300.0, 2 * bench.env_step_timeout_s),
            "serve_order": "first_complete"
            if scheduler == "per_env_first_complete"
            else "fifo",
            "rollout_sched_policy": bench.rollout_sched_policy,
        },
        "logging": {
            "console": False,
            "progress_bar": False,
            "save_trajectories": False,
        },
    }
    config = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(PipelineConfig), OmegaConf.create(data))
    )
    validate_config(config)
    return config


# -- the engine and the runs ---------------------------------------------------------------


@dataclass
class BenchContext:
    transport: str
    model_path: str
    tokenizer: Any
    engine_config: Any
    client: Any  # generate/abort/stats: the in-process VLLMEngine, or a client of the engine actor (engine_clients)
    handles: list[Any] = field(default_factory=list)
    engine: Any = None
    sample_interval_s: float = 0.05

    async def stats(self) -> dict[str, Any]:
        result = self.client.stats()
        return await result if inspect.isawaitable(result) else result


class EngineSampler:
    """Samples the engine's stats every ``interval_s`` in the background (engine busy fraction, in-flight requests)."""

    def __init__(
        self, stats: Callable[[], Awaitable[dict[str, Any]]], interval_s: float
    ) -> None:
        self._stats = stats
        self.interval_s = interval_s
        self.samples: list[EngineSample] = []
        self._task: asyncio.Task | None = None

    async def _loop(self) -> None:
        while True:
            try:
                s = await self._stats()
                self.samples.append(
                    EngineSample(
                        t=time.time(),
                        in_flight=float(s.get("in_flight", s.get("running", 0))),
                        running=float(s.get("running", 0)),
                        waiting=float(s.get("waiting", 0)),
                        generation_tokens=float(s.get("generation_tokens", 0)),
                    )
                )
            except Exception:  # noqa: BLE001 - a missed sample is not worth failing a run
                logger.debug("engine stats sample failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-sampler")

    async def stop(self) -> list[EngineSample]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.samples


def _load1() -> float:
    """1-minute load average (other work on the machine shows up here; timings are noisy above ~cpu_count)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return math.nan


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


#: VLLMEngine.stats() counters per engine step (cumulative); a run keeps their change over its window.
ENGINE_STEP_COUNTERS = (
    "engine_steps",
    "engine_step_generation_tokens",
    "engine_step_running_sum",
)


def engine_step_notes(
    before: dict[str, Any], after: dict[str, Any]
) -> dict[str, float]:
    """Engine steps and what they carried between two stats() snapshots ({} for an engine without the counters)."""
    if not all(key in before and key in after for key in ENGINE_STEP_COUNTERS):
        return {}
    return {key: float(after[key]) - float(before[key]) for key in ENGINE_STEP_COUNTERS}


def engine_step_figures(notes: dict[str, Any], wall_s: float) -> dict[str, float]:
    """tokens/s = steps/s x generated tokens per step: slow steps (CPU contention) vs thin steps (too few requests)."""
    steps = float(notes.get("engine_steps", 0.0))
    if steps <= 0 or wall_s <= 0:
        return {}
    return {
        "engine_steps_per_s": steps / wall_s,
        "generation_tokens_per_step": float(notes["engine_step_generation_tokens"])
        / steps,
        "running_per_step": float(notes["engine_step_running_sum"]) / steps,
    }


@dataclass
class RunWindow:
    """What a run's window records besides its trajectories: tokens generated, engine steps, CPU by process."""

    stats: dict[str, Any]
    cpu: dict[int, tuple[str, float]]

    @classmethod
    async def open(cls, ctx: BenchContext) -> RunWindow:
        return cls(await ctx.stats(), process_cpu.snapshot())

    async def close(self, ctx: BenchContext) -> tuple[float, dict[str, Any]]:
        """(generated tokens, notes: engine step counts and ``cpu_s_<role>``) since :meth:`open`."""
        cpu = process_cpu.snapshot()
        stats = await ctx.stats()
        tokens = float(stats.get("generation_tokens", 0)) - float(
            self.stats.get("generation_tokens", 0)
        )
        return tokens, {
            **engine_step_notes(self.stats, stats),
            **process_cpu.notes_from(self.cpu, cpu),
        }


@dataclass
class RunOutput:
    trajectories: list[Trajectory]
    wall_s: float
    windows: list[BatchWindow]
    waits: list[float]
    samples: list[EngineSample]
    engine_tokens: float
    notes: dict[str, Any] = field(default_factory=dict)


def _rates(out: RunOutput) -> tuple[float, float]:
    """(trajectories/s, tokens/s) of one run, as the rows define them (summarize_run)."""
    summary = summarize_run(
        out.trajectories, wall_s=out.wall_s, windows=out.windows, batch_waits=out.waits
    )
    return summary["trajectories_per_s"], summary["tokens_per_s"]


def pool_runs(outputs: list[RunOutput]) -> RunOutput:
    """Repeats of one scheduler as one run: trajectories, wall time, batches and samples put together."""
    if len(outputs) == 1:
        return outputs[0]
    notes: dict[str, Any] = {}
    for out in outputs:
        for key, value in out.notes.items():
            if key == "load1":
                notes[key] = max(notes.get(key, 0.0), value)
            elif isinstance(value, (int, float)):
                notes[key] = notes.get(key, 0) + value
            else:
                notes[key] = value
    return RunOutput(
        trajectories=[t for o in outputs for t in o.trajectories],
        wall_s=sum(o.wall_s for o in outputs),
        windows=[w for o in outputs for w in o.windows],
        waits=[w for o in outputs for w in o.waits],
        samples=[x for o in outputs for x in o.samples],
        engine_tokens=sum(o.engine_tokens for o in outputs),
        notes=notes,
    )


async def run_per_env(
    ctx: BenchContext, config: Any, *, sync: bool, warmup_s: float = 0.0
) -> RunOutput:
    """Collect num_batches x rollout_batch_size trajectories through the real scheduler.

    ``warmup_s`` > 0: after the actors start, the scheduler is suspended at once (every env's first episode,
    just begun, is cancelled) and the fresh worker processes get ``warmup_s`` to settle before timing starts
    (the barrier runs in the long-lived driver, which is warm). The next get_batch resumes the loops.
    """
    if ctx.transport == "ray":
        from roll_async.scheduler.rollout_scheduler import RolloutScheduler

        scheduler: Any = RolloutScheduler(
            rollout_spec(config, "train"),
            engine_handles=ctx.handles,
            tokenizer_path=ctx.model_path,
        )
    else:
        from roll_async.scheduler.local import LocalRolloutScheduler

        scheduler = LocalRolloutScheduler(
            rollout_spec(config, "train"), engines=ctx.engine, tokenizer=ctx.tokenizer
        )
    sampler = EngineSampler(ctx.stats, ctx.sample_interval_s)
    trajectories: list[Trajectory] = []
    windows: list[BatchWindow] = []
    waits: list[float] = []
    notes: dict[str, Any] = {}
    try:
        creating = time.perf_counter()
        # actors are created (Ray) and the env loops start at the end of this call
        await scheduler.start()
        if warmup_s > 0:
            await _maybe_await(scheduler.suspend(cancel_in_flight=True))
            await asyncio.sleep(warmup_s)
        notes["start_s"] = time.perf_counter() - creating
        window = await RunWindow.open(ctx)
        sampler.start()
        started = time.time()
        previous = started
        for step in range(config.num_batches):
            asked = time.time()
            batch, metrics = await scheduler.get_batch_with_metrics(step)
            ready = time.time()
            waits.append(ready - asked)
            windows.append(BatchWindow(previous, ready, [t.finished_at for t in batch]))
            previous = ready
            trajectories.extend(batch)
            notes.setdefault("cancelled_episodes", 0)
            notes["cancelled_episodes"] += int(
                metrics.get("rollout/cancelled_episodes", 0)
            )
            if sync:
                await _maybe_await(scheduler.resume())
        ended = time.time()
        engine_tokens, window_notes = await window.close(ctx)
        notes.update(window_notes)
        samples = await sampler.stop()
        if ctx.transport == "ray":
            notes["workers"] = scheduler.num_workers
    finally:
        await sampler.stop()
        await scheduler.shutdown()
    # Without a warm-up the loops start a few ms before start() returns: count from the first episode if earlier.
    t0 = (
        started
        if warmup_s > 0
        else min([started] + [t.started_at for t in trajectories if t.started_at > 0])
    )
    windows[0].start = t0
    return RunOutput(
        trajectories,
        ended - t0,
        windows,
        waits,
        [s for s in samples if t0 <= s.t <= ended],
        engine_tokens,
        notes,
    )


async def run_barrier(ctx: BenchContext, config: Any) -> RunOutput:
    """The same number of trajectories (rounded up to whole rounds) with per-turn barriers, in the driver."""
    from benchmarks.barrier_rollout import BarrierRollout

    barrier = BarrierRollout(config, engine=ctx.client, tokenizer=ctx.tokenizer)
    sampler = EngineSampler(ctx.stats, ctx.sample_interval_s)
    try:
        window = await RunWindow.open(ctx)
        sampler.start()
        started = time.time()
        rounds = await barrier.collect(config.num_batches * config.rollout_batch_size)
        ended = time.time()
        engine_tokens, window_notes = await window.close(ctx)
        samples = await sampler.stop()
    finally:
        await sampler.stop()
        barrier.close()
    trajectories = [t for r in rounds for t in r.trajectories]
    windows = [
        BatchWindow(
            r.started_at, r.finished_at, [t.finished_at for t in r.trajectories]
        )
        for r in rounds
    ]
    # a trainer waits for the whole round
    waits = [r.finished_at - r.started_at for r in rounds]
    notes = {
        "rounds": len(rounds),
        "barrier_turns": sum(r.turns for r in rounds),
        **window_notes,
    }
    return RunOutput(
        trajectories,
        ended - started,
        windows,
        waits,
        [s for s in samples if started <= s.t <= ended],
        engine_tokens,
        notes,
    )


async def run_replay(
    ctx: BenchContext, config: Any, recorded: list[Trajectory]
) -> RunOutput:
    """The per_env run's requests again, from ``num_envs`` bare loops in the driver (benchmarks.replay_rollout)."""
    from benchmarks.replay_rollout import ReplayRollout

    concurrency = (
        config.train_env_manager.num_env_groups * config.train_env_manager.group_size
    )
    replay = ReplayRollout(
        ctx.client,
        concurrency=concurrency,
        temperature=config.generation.temperature,
        top_p=config.generation.top_p,
    )
    sampler = EngineSampler(ctx.stats, ctx.sample_interval_s)
    try:
        window = await RunWindow.open(ctx)
        sampler.start()
        started = time.time()
        trajectories = await replay.replay(recorded)
        ended = time.time()
        engine_tokens, notes = await window.close(ctx)
        samples = await sampler.stop()
    finally:
        await sampler.stop()
    windows = [BatchWindow(started, ended, [t.finished_at for t in trajectories])]
    return RunOutput(
        trajectories,
        ended - started,
        windows,
        [],
        [s for s in samples if started <= s.t <= ended],
        engine_tokens,
        notes,
    )


async def measure_ceiling(
    ctx: BenchContext, concurrency: int, prompt_len: int, output_len: int, rounds: int
) -> dict[str, float]:
    from benchmarks.engine_ceiling import measure

    max_len = ctx.engine_config.max_model_len
    prompt_len = max(1, min(prompt_len, max_len - output_len - 1))
    window, started = await RunWindow.open(ctx), time.perf_counter()
    result = await measure(ctx.client, concurrency, prompt_len, output_len, rounds)
    # over all rounds (the ceiling itself is the best round): the bare engine's step rate and batch per step
    _, notes = await window.close(ctx)
    steps = engine_step_figures(notes, time.perf_counter() - started)
    return {**result, **{f"ceiling_{key}": value for key, value in steps.items()}}


# -- one grid point ------------------------------------------------------------------------


def _row(
    bench: BenchConfig,
    workload: Workload,
    point: GridPoint,
    scheduler: str,
    config: Any,
    out: RunOutput,
) -> dict[str, Any]:
    summary = summarize_run(
        out.trajectories,
        wall_s=out.wall_s,
        windows=out.windows,
        batch_waits=out.waits,
        samples=out.samples,
        engine_generated_tokens=out.engine_tokens,
    )
    per_env = scheduler.startswith("per_env")
    return {
        "workload": workload.name,
        "point": point.label,
        "scheduler": scheduler,
        "transport": bench.transport if per_env else f"{bench.transport} (driver loop)",
        "num_env_groups": point.num_env_groups,
        "group_size": point.group_size,
        "max_env_num_per_worker": point.max_env_num_per_worker,
        "num_envs": point.num_envs,
        "rollout_batch_size": point.batch_size,
        "num_batches": config.num_batches,
        "mode": config.mode if per_env else scheduler,
        "max_staleness": config.max_staleness if per_env else "",
        **summary,
        **engine_step_figures(out.notes, out.wall_s),
        **process_cpu.cores_from(out.notes, out.wall_s),
        **{f"note_{k}": v for k, v in out.notes.items()},
    }


async def run_point(
    ctx: BenchContext,
    bench: BenchConfig,
    workload: Workload,
    point: GridPoint,
    *,
    ceiling: bool,
    barrier_cache: dict[tuple, tuple[str, RunOutput]] | None = None,
) -> list[dict[str, Any]]:
    """All schedulers of one grid point back to back, then the ceiling at the point's concurrency and lengths
    (after every repeat, so each repeat's ratio to it is side by side).

    The barrier does not depend on max_env_num_per_worker (it has no workers), so a point that differs
    from an earlier one only in that reuses the earlier barrier run (``note_barrier_from`` says which).
    """
    from roll_async.pipelines.preflight import check_envs

    schedulers = list(point.schedulers or workload.schedulers)
    runs: dict[str, list[RunOutput]] = {s: [] for s in schedulers}
    configs: dict[str, Any] = {}
    ceilings: list[dict[str, Any]] = []
    for repeat in range(max(1, workload.repeats)):
        # ABBA order over repeats, so a drift in machine load does not favour one scheduler
        for scheduler in schedulers if repeat % 2 == 0 else schedulers[::-1]:
            config = configs.get(scheduler) or pipeline_config(
                bench, workload, point, scheduler
            )
            if scheduler not in configs:
                check_envs(config)
                configs[scheduler] = config
            tag = f"[{workload.name} {point.label}] {scheduler}" + (
                f" (repeat {repeat + 1})" if workload.repeats > 1 else ""
            )
            key = (
                workload.name,
                point.num_env_groups,
                point.group_size,
                config.rollout_batch_size,
                config.num_batches,
                repeat,
            )
            if (
                scheduler == "barrier"
                and barrier_cache is not None
                and key in barrier_cache
            ):
                source, out = barrier_cache[key]
                out = RunOutput(
                    **{**vars(out), "notes": {**out.notes, "barrier_from": source}}
                )
                print(
                    f"{tag}: same as at {source} (the barrier has no workers)",
                    flush=True,
                )
            elif scheduler == "barrier":
                print(f"{tag}: running ...", flush=True)
                out = await run_barrier(ctx, config)
                if barrier_cache is not None:
                    barrier_cache[key] = (point.label, out)
            elif scheduler == "replay":
                # ABBA order puts replay before per_env in odd repeats: it replays the latest per_env run
                recorded = (runs.get("per_env") or [None])[-1]
                if recorded is None:
                    raise RuntimeError(
                        f"{tag}: no per_env run to replay yet (list per_env before replay)"
                    )
                print(
                    f"{tag}: replaying {len(recorded.trajectories)} per_env episodes ...",
                    flush=True,
                )
                out = await run_replay(ctx, config, recorded.trajectories)
            else:
                print(f"{tag}: running ...", flush=True)
                out = await run_per_env(
                    ctx,
                    config,
                    sync=scheduler == "per_env_sync",
                    warmup_s=bench.per_env_warmup_s,
                )
            out.notes["load1"] = max(out.notes.get("load1", 0.0), _load1())
            runs[scheduler].append(out)
            once = _row(bench, workload, point, scheduler, config, out)
            print(
                f"{tag}: {once['trajectories']} traj in {once['wall_s']:.1f}s = {once['trajectories_per_s']:.2f} traj/s, "
                f"{once['tokens_per_s']:.0f} tok/s, busy {once['engine_busy_fraction']:.2f}, "
                f"p50/p99 {once['episode_latency_p50_s']:.2f}/{once['episode_latency_p99_s']:.2f}s, tail10 {once['tail10_share']:.2f}",
                flush=True,
            )
        if ceiling:
            # Measured after every repeat, so each repeat's ratio to the ceiling is side by side (the machine's
            # speed drifts by 10-35% within minutes here); the shape is this repeat's mean request.
            ceilings.append(
                await _ceiling_for(
                    ctx,
                    workload,
                    point,
                    bench,
                    [outs[-1] for outs in runs.values() if outs],
                )
            )
    outputs = {s: pool_runs(outs) for s, outs in runs.items()}
    rows = [_row(bench, workload, point, s, configs[s], outputs[s]) for s in schedulers]
    for row in rows:
        row["repeats"] = len(runs[row["scheduler"]])
        if row["repeats"] > 1:
            row["per_repeat_trajectories_per_s"] = [
                len(o.trajectories) / o.wall_s for o in runs[row["scheduler"]]
            ]
    barrier = next((r for r in rows if r["scheduler"] == "barrier"), None)
    per_repeat = {s: [_rates(o) for o in outs] for s, outs in runs.items()}
    for row in rows:
        if (
            barrier is not None
            and row["repeats"] > 1
            and len(per_repeat.get("barrier", [])) == row["repeats"]
        ):
            # Repeat i of each scheduler ran next to repeat i of the barrier (ABBA): one ratio per pair.
            row["speedup_vs_barrier_runs"] = spread(
                [
                    mine[0] / theirs[0]
                    for mine, theirs in zip(
                        per_repeat[row["scheduler"]], per_repeat["barrier"]
                    )
                ]
            )
        if barrier is not None and barrier["trajectories_per_s"] > 0:
            row["speedup_vs_barrier"] = (
                row["trajectories_per_s"] / barrier["trajectories_per_s"]
            )
            row["token_speedup_vs_barrier"] = (
                row["tokens_per_s"] / barrier["tokens_per_s"]
                if barrier["tokens_per_s"] > 0
                else math.nan
            )
    if per_repeat.get("replay") and per_repeat.get("per_env"):
        # per_env ÷ its own replay, tokens/s, one ratio per repeat: what the rollout machinery costs
        per_env_row = next(r for r in rows if r["scheduler"] == "per_env")
        per_env_row["tokens_vs_replay_runs"] = spread(
            [
                mine[1] / theirs[1]
                for mine, theirs in zip(per_repeat["per_env"], per_repeat["replay"])
                if theirs[1] > 0
            ]
        )
    if ceilings:
        # The row's ceiling is the median repeat's; each repeat's ratio uses its own ceiling.
        c = sorted(ceilings, key=lambda m: m["tokens_per_s"])[(len(ceilings) - 1) // 2]
        for row in rows:
            row.update(
                ceiling_concurrency=c["concurrency"],
                ceiling_prompt_len=c["prompt_len"],
                ceiling_output_len=c["output_len"],
                ceiling_tokens_per_s=c["tokens_per_s"],
                tokens_vs_ceiling=row["tokens_per_s"] / c["tokens_per_s"]
                if c["tokens_per_s"] > 0
                else math.nan,
                **{
                    key: value for key, value in c.items() if key.startswith("ceiling_")
                },
            )
            if len(ceilings) > 1:
                row["ceiling_tokens_per_s_runs"] = spread(
                    [m["tokens_per_s"] for m in ceilings]
                )
            if row["repeats"] > 1 and len(ceilings) == row["repeats"]:
                row["tokens_vs_ceiling_runs"] = spread(
                    [
                        tok / m["tokens_per_s"]
                        for (_, tok), m in zip(per_repeat[row["scheduler"]], ceilings)
                        if m["tokens_per_s"] > 0
                    ]
                )
    return rows


async def _ceiling_for(
    ctx: BenchContext,
    workload: Workload,
    point: GridPoint,
    bench: BenchConfig,
    outs: list[RunOutput],
) -> dict[str, Any]:
    """The engine ceiling at the point's concurrency and the mean request shape of ``outs``."""
    prompt_mean, output_mean, _ = mean_request_shape(
        [t for out in outs for t in out.trajectories]
    )
    concurrency = min(point.num_envs, ctx.engine_config.max_num_seqs)
    prompt_len, output_len = max(1, round(prompt_mean)), max(1, round(output_mean))
    print(
        f"[{workload.name} {point.label}] ceiling: N={concurrency} prompt={prompt_len} output={output_len} ...",
        flush=True,
    )
    c = await measure_ceiling(
        ctx, concurrency, prompt_len, output_len, bench.ceiling_rounds
    )
    print(
        f"[{workload.name} {point.label}] ceiling: {c['tokens_per_s']:.0f} tok/s",
        flush=True,
    )
    return {**c, "concurrency": concurrency, "output_len": output_len}


# -- the whole benchmark -------------------------------------------------------------------


async def start_engine(bench: BenchConfig) -> BenchContext:
    from roll_async.config.schema import EngineConfig
    from roll_async.model.paths import resolve_model_path
    from roll_async.prompts.tokenizers import load_tokenizer

    model_path = resolve_model_path(bench.model)
    tokenizer = load_tokenizer(model_path)
    engine_config = EngineConfig(**bench.engine)
    if bench.transport == "ray":
        from roll_async.engine.engine_actor import engine_clients, launch_engines
        from roll_async.runtime.ray_utils import init_ray

        init_ray(None, bench.ray_num_cpus)
        handles = await launch_engines(
            model_path, engine_config, name_prefix="bench_grouping_engine"
        )
        # The barrier and the ceiling reach the engine by the same request transport as the per-env workers.
        client = engine_clients(handles[:1], engine_config.request_transport)[0]
        return BenchContext(
            "ray",
            model_path,
            tokenizer,
            engine_config,
            client,
            handles=handles,
            sample_interval_s=bench.sample_interval_s,
        )
    from roll_async.engine import VLLMEngine

    engine = VLLMEngine(model_path, engine_config)
    await engine.start()
    return BenchContext(
        "inprocess",
        model_path,
        tokenizer,
        engine_config,
        engine,
        engine=engine,
        sample_interval_s=bench.sample_interval_s,
    )


async def treat_driver_like_workers(ctx: BenchContext, policy: str) -> dict[str, Any]:
    """Give the driver's rollout loops (barrier, replay, ceiling, get_batch) the per-env workers' CPU standing.

    Ray starts its worker processes (the engine actor and vLLM's processes under it, the EnvManagerWorkers,
    the queue actor) at niceness 15 and leaves the driver at 0: a weight of 1024 against 36, so a loop in the
    driver would get the CPU ahead of the engine and of per-env's loops. The driver takes the engine
    actor's niceness (read from its pid; same machine) and the rollout scheduling policy, after the engine's
    processes started (they must not inherit either). In one process (inprocess) nothing is changed.
    """
    info = await ctx.handles[0].info.remote()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, int(info["pid"]))
    except (KeyError, OSError, TypeError, ValueError):
        niceness = None  # not on this machine: leave it
    if niceness is not None:
        for tid in os.listdir("/proc/self/task"):
            try:
                if os.getpriority(os.PRIO_PROCESS, int(tid)) < niceness:
                    os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
            except OSError:
                continue
    return {
        "driver_niceness": niceness,
        "rollout_sched_policy": sched_policy.apply_to_process(policy),
    }


async def stop_engine(ctx: BenchContext | None) -> None:
    if ctx is None:
        return
    if ctx.transport == "ray":
        import ray

        from roll_async.engine.engine_actor import shutdown_engines

        ctx.client.close()  # a client from engine_clients (its ZMQ socket, if any)
        await shutdown_engines(ctx.handles)
        ray.shutdown()
    elif ctx.engine is not None:
        await ctx.engine.shutdown()


async def run_benchmark(bench: BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = _load1()
    ctx: BenchContext | None = None
    rows: list[dict[str, Any]] = []
    driver_standing: dict[str, Any] = {}
    try:
        ctx = await start_engine(bench)
        if ctx.transport == "ray":
            driver_standing = await treat_driver_like_workers(
                ctx, bench.rollout_sched_policy
            )
        startup = time.perf_counter() - started
        print(
            f"engine ready in {startup:.0f}s ({bench.transport}); warming up",
            flush=True,
        )
        await measure_ceiling(ctx, min(16, ctx.engine_config.max_num_seqs), 64, 16, 1)
        barrier_cache: dict[tuple, tuple[str, RunOutput]] = {}
        for workload in bench.workloads:
            for point in workload.grid:
                rows.extend(
                    await run_point(
                        ctx,
                        bench,
                        workload,
                        point,
                        ceiling=workload.ceiling,
                        barrier_cache=barrier_cache,
                    )
                )
    finally:
        await stop_engine(ctx)
    return {
        "name": bench.name,
        "transport": bench.transport,
        "request_transport": ctx.engine_config.request_transport
        if ctx
        else bench.engine.get("request_transport"),
        "rollout_sched_policy": bench.rollout_sched_policy
        if bench.transport == "ray"
        else "normal",
        "driver_niceness": driver_standing.get("driver_niceness"),
        "model": ctx.model_path if ctx else bench.model,
        "engine": bench.engine,
        "seconds_total": time.perf_counter() - started,
        "load_average_1min": {
            "start": load_start,
            "end": _load1(),
            "max_during_runs": max(
                (r.get("note_load1", 0.0) for r in rows), default=0.0
            ),
        },
        "workloads": [
            {
                "name": w.name,
                "description": w.description,
                "schedulers": w.schedulers,
                "custom_envs": w.custom_envs,
                "grid": [vars(p) for p in w.grid],
            }
            for w in bench.workloads
        ],
        "rows": rows,
    }


# -- output --------------------------------------------------------------------------------

CSV_COLUMNS = [
    "workload",
    "point",
    "scheduler",
    "transport",
    "mode",
    "max_staleness",
    "num_env_groups",
    "group_size",
    "max_env_num_per_worker",
    "num_envs",
    "rollout_batch_size",
    "num_batches",
    "trajectories",
    "wall_s",
    "trajectories_per_s",
    "tokens_per_s",
    "engine_tokens_per_s",
    "speedup_vs_barrier",
    "token_speedup_vs_barrier",
    "ceiling_concurrency",
    "ceiling_prompt_len",
    "ceiling_output_len",
    "ceiling_tokens_per_s",
    "tokens_vs_ceiling",
    "engine_busy_fraction",
    "engine_mean_in_flight",
    "engine_steps_per_s",
    "generation_tokens_per_step",
    "running_per_step",
    "ceiling_engine_steps_per_s",
    "ceiling_generation_tokens_per_step",
    "get_batch_wait_mean_s",
    "get_batch_wait_total_s",
    "episode_latency_p50_s",
    "episode_latency_p99_s",
    "episode_latency_max_s",
    "tail10_share",
    "turns_mean",
    "turns_max",
    "response_len_mean",
    "mean_prompt_len",
    "mean_output_len",
    "requests",
    "generate_p99_s",
    "env_step_p50_s",
    "env_step_p99_s",
    "env_errors",
    "repeats",
    "per_repeat_trajectories_per_s",
    "note_load1",
    "stop_reasons",
    *[f"cpu_cores_{role}" for role in process_cpu.ALL_ROLES],
]


def _fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.{digits}f}"
    return str(value)


def headline(result: dict[str, Any]) -> list[str]:
    """The ratios the README quotes: first grid point of each workload, per-env vs barrier and vs the ceiling."""
    lines = []
    seen: set[str] = set()
    for row in result["rows"]:
        if row["workload"] in seen or row["scheduler"] != "per_env":
            continue
        seen.add(row["workload"])
        point = [
            r
            for r in result["rows"]
            if r["workload"] == row["workload"] and r["point"] == row["point"]
        ]
        parts = [f"**{row['workload']}** ({row['point']}, {row['num_envs']} envs)"]
        if "speedup_vs_barrier_runs" in row:
            runs = row["speedup_vs_barrier_runs"]
            parts.append(
                f"per-env ÷ barrier: **{runs['median']:.2f}x** trajectories/s (median of {len(runs['values'])} paired "
                f"runs, {runs['min']:.2f}–{runs['max']:.2f}; pooled {row['speedup_vs_barrier']:.2f}x)"
            )
        elif "speedup_vs_barrier" in row:
            parts.append(
                f"per-env ÷ barrier: **{row['speedup_vs_barrier']:.2f}x** trajectories/s, "
                f"{row['token_speedup_vs_barrier']:.2f}x tokens/s"
            )
        for scheduler, label in (
            ("per_env_first_complete", "per-env first_complete"),
            ("per_env_sync", "per-env sync"),
        ):
            other = next((r for r in point if r["scheduler"] == scheduler), None)
            if other is not None and "speedup_vs_barrier_runs" in other:
                runs = other["speedup_vs_barrier_runs"]
                parts.append(
                    f"{label} ÷ barrier: **{runs['median']:.2f}x** ({runs['min']:.2f}–{runs['max']:.2f})"
                )
            elif other is not None and "speedup_vs_barrier" in other:
                parts.append(f"{label} ÷ barrier: {other['speedup_vs_barrier']:.2f}x")
        if "tokens_vs_ceiling_runs" in row:
            runs = row["tokens_vs_ceiling_runs"]
            text = (
                f"per-env ÷ ceiling: **{runs['median']:.2f}** (tokens/s; median of {len(runs['values'])} runs, "
                f"{runs['min']:.2f}–{runs['max']:.2f})"
            )
            for scheduler in ("barrier", "replay"):
                other = [r for r in point if r["scheduler"] == scheduler]
                if other and "tokens_vs_ceiling_runs" in other[0]:
                    text += f", {scheduler} ÷ ceiling: {other[0]['tokens_vs_ceiling_runs']['median']:.2f}"
            parts.append(text)
        elif "tokens_vs_ceiling" in row:
            text = f"per-env ÷ ceiling: **{row['tokens_vs_ceiling']:.2f}** (tokens/s)"
            for scheduler in ("barrier", "replay"):
                other = [r for r in point if r["scheduler"] == scheduler]
                if other and "tokens_vs_ceiling" in other[0]:
                    text += (
                        f", {scheduler} ÷ ceiling: {other[0]['tokens_vs_ceiling']:.2f}"
                    )
            parts.append(text)
        if "tokens_vs_replay_runs" in row:
            runs = row["tokens_vs_replay_runs"]
            parts.append(
                f"per-env ÷ replay of its own requests: **{runs['median']:.2f}** (tokens/s; "
                f"{runs['min']:.2f}–{runs['max']:.2f}): the rollout machinery's cost"
            )
        lines.append("- " + "; ".join(parts))
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [
        f"# Env grouping benchmark: {result['name']} ({machine.get('gpu') or machine.get('cpu_model')}, {machine.get('cpu_count')} CPUs)",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}, {result['seconds_total']:.0f} s in all; 1-minute load average "
        f"{result.get('load_average_1min', {})} (other work on this machine; above {machine.get('cpu_count')} timings get noisy)  ",
        f"Machine: {machine}  ",
        f"Model: `{result['model']}`; engine: {result['engine']}  ",
        f"Transport: **{result['transport']}** — "
        + (
            "per-env = RolloutScheduler over Ray (GroupQueueManager actor + EnvManagerWorker actors) calling the engine "
            "actor; barrier and ceiling run in the driver and call the same engine actor. Generate requests go by "
            f"engine.request_transport: **{result.get('request_transport') or 'ray'}** (workers, barrier and ceiling alike). "
            f"Rollout scheduling policy: **{result.get('rollout_sched_policy') or 'normal'}** (workers, queue and the "
            "driver's loops alike; roll_async/runtime/sched_policy.py); the driver's loops run at the Ray workers' niceness "
            f"({result.get('driver_niceness')})."
            if result["transport"] == "ray"
            else "everything in one process: per-env = LocalRolloutScheduler, barrier and ceiling in the same event loop, "
            "all on one in-process VLLMEngine (max_env_num_per_worker has no effect)."
        ),
        "",
        "All schedulers of a grid point ran back to back on the same engine; only ratios within this run are meaningful.",
        "",
        "## Headline",
        "",
        *headline(result),
        "",
    ]
    workloads = []
    for row in result["rows"]:
        if row["workload"] not in workloads:
            workloads.append(row["workload"])
    described = {w["name"]: w for w in result.get("workloads", [])}
    for name in workloads:
        rows = [r for r in result["rows"] if r["workload"] == name]
        lines += [f"## {name}", ""]
        if described.get(name, {}).get("description"):
            lines += [described[name]["description"].strip(), ""]
        lines += [
            "| point | scheduler | traj | wall s | traj/s | tok/s | ÷ barrier | ceiling tok/s | ÷ ceiling | busy | in flight | steps/s | tok/step | get_batch wait s | p50 s | p99 s | tail10 share | turns mean/max | out len |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['point']} | {r['scheduler']} | {r['trajectories']} | {_fmt(r['wall_s'], 1)} | {_fmt(r['trajectories_per_s'])} | "
                f"{_fmt(r['tokens_per_s'], 0)} | {_fmt(r.get('speedup_vs_barrier', math.nan))} | "
                f"{_fmt(r.get('ceiling_tokens_per_s', math.nan), 0)} | {_fmt(r.get('tokens_vs_ceiling', math.nan))} | "
                f"{_fmt(r['engine_busy_fraction'])} | {_fmt(r['engine_mean_in_flight'], 1)} | "
                f"{_fmt(r.get('engine_steps_per_s', math.nan), 1)} | {_fmt(r.get('generation_tokens_per_step', math.nan), 1)} | "
                f"{_fmt(r['get_batch_wait_mean_s'])} | "
                f"{_fmt(r['episode_latency_p50_s'])} | {_fmt(r['episode_latency_p99_s'])} | {_fmt(r['tail10_share'])} | "
                f"{_fmt(r['turns_mean'], 1)}/{r['turns_max']} | {_fmt(r['mean_output_len'], 1)} |"
            )
        lines.append("")
        lines += _cpu_table(rows)
    lines += [
        'Columns: see benchmarks/README.md ("What the figures mean"). `÷ barrier` is trajectories/s over the barrier\'s at '
        "the same grid point; `÷ ceiling` is generated tokens/s over the bare engine's at the same concurrency and mean "
        "prompt/output lengths, measured in this run. `steps/s` and `tok/step` split tokens/s into the engine's step rate "
        "and the tokens generated per step over the run's window"
        + _ceiling_steps_clause(result["rows"])
        + ".",
        "",
    ]
    return "\n".join(lines)


def _cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    """Cores used by each process role over each run's window (benchmarks/process_cpu.py), if recorded."""
    present = [
        role
        for role in process_cpu.ALL_ROLES
        if any(f"cpu_cores_{role}" in r for r in rows)
    ]
    if not present:
        return []
    lines = [
        "CPU by process (cores over each run's window; this benchmark's process and its descendants):",
        "",
        "| point | scheduler | " + " | ".join(present) + " | all |",
        "|---|---|" + "---:|" * (len(present) + 1),
    ]
    for r in rows:
        cores = [r.get(f"cpu_cores_{role}", 0.0) for role in present]
        lines.append(
            f"| {r['point']} | {r['scheduler']} | "
            + " | ".join(_fmt(c) for c in cores)
            + f" | {_fmt(sum(cores))} |"
        )
    return lines + [""]


def _ceiling_steps_clause(rows: list[dict[str, Any]]) -> str:
    figures = {
        (
            r["point"],
            f"{_fmt(r['ceiling_engine_steps_per_s'], 1)} steps/s x {_fmt(r['ceiling_generation_tokens_per_step'], 1)} tok/step",
        )
        for r in rows
        if "ceiling_engine_steps_per_s" in r
    }
    if not figures:
        return ""
    return (
        " (the ceiling, over all its rounds: "
        + "; ".join(f"{point} {text}" for point, text in sorted(figures))
        + ")"
    )


#: The files a grouping run writes, without and with plots.
RESULT_SUFFIXES = (".json", ".csv", ".md")
PLOT_SUFFIXES = (".png", "_sweep.png")


def claim_results(
    stem: str, plots: bool = True, overwrite: bool = False
) -> ResultFiles:
    """Where a grouping run named ``stem`` writes; exits with one line if a file exists and not ``overwrite``."""
    suffixes = RESULT_SUFFIXES + (PLOT_SUFFIXES if plots else ())
    return ResultFiles.claim(stem, suffixes, overwrite=overwrite)


def write_results(
    result: dict[str, Any], out: ResultFiles, plots: bool = True
) -> list[Path]:
    path = out.write_json(result)
    saved = json.loads(path.read_text())
    written = [path]
    csv_path = out.path(".csv")
    with csv_path.open("w", newline="") as f:
        f.write(
            f"# command: {saved['command']}\n# recorded: {saved['recorded_at']}\n# machine: {json.dumps(saved['machine'])}\n"
        )
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in saved["rows"]:
            writer.writerow(
                {
                    k: (json.dumps(v) if isinstance(v, (dict, list)) else v)
                    for k, v in row.items()
                }
            )
    written.append(csv_path)
    written.append(out.write_text(".md", to_markdown(saved)))
    if plots:
        from benchmarks.grouping_plots import plot_overview, plot_sweep

        title = f"{saved['name']} | {saved['transport']} | {saved['machine'].get('gpu') or saved['machine'].get('cpu_model')} x{saved['machine'].get('cpu_count')} | {saved['command']}"
        written.append(plot_overview(saved["rows"], out.path(".png"), title))
        sweep = plot_sweep(saved["rows"], out.path("_sweep.png"), title)
        if sweep is not None:
            written.append(sweep)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        default=None,
        help=f"benchmark YAML (default: {QUICK_CONFIG.relative_to(CONFIG_DIR.parent.parent)})",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="use the full (GPU) config benchmarks/configs/grouping_full.yaml",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=None,
        help="override the config's transport",
    )
    parser.add_argument(
        "--request-transport",
        choices=REQUEST_TRANSPORTS,
        default=None,
        help="override engine.request_transport (how workers, the barrier and the ceiling send requests)",
    )
    parser.add_argument(
        "--rollout-sched-policy",
        choices=sorted(sched_policy.POLICIES),
        default=None,
        help="override rollout_sched_policy (the per-env workers and queue, and over Ray the driver's loops)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model dir (default: the config's, else the offline tiny model)",
    )
    parser.add_argument(
        "--workloads", nargs="+", default=None, help="run only these workloads"
    )
    parser.add_argument(
        "--num-batches",
        type=int,
        default=None,
        help="override num_batches for every workload",
    )
    parser.add_argument(
        "--max-points",
        type=int,
        default=None,
        help="run only the first N grid points of each workload",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="override every workload's repeats (ABBA order); ratios get a median and min-max over repeats",
    )
    parser.add_argument(
        "--schedulers",
        nargs="+",
        default=None,
        choices=SCHEDULERS,
        help="run only these schedulers (at every point that has them)",
    )
    add_output_args(parser, name_default=None, plots=True)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the runs the config describes and exit",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="run the scale simulation instead (benchmarks.scale_sim); every other argument goes to it",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--simulate" in argv:
        # Hand every other argument over as given (--name, --no-plots, --repeats, ...): this parser
        # must not consume the ones both benchmarks know.
        from benchmarks import scale_sim

        return scale_sim.main([a for a in argv if a != "--simulate"])
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    bench = load_bench_config(
        args.config or (FULL_CONFIG if args.full else QUICK_CONFIG)
    )
    if args.transport:
        bench.transport = args.transport
    if args.request_transport:
        bench.engine = {**bench.engine, "request_transport": args.request_transport}
    if args.rollout_sched_policy:
        bench.rollout_sched_policy = args.rollout_sched_policy
    if args.model:
        bench.model = args.model
    if args.workloads:
        unknown = set(args.workloads) - {w.name for w in bench.workloads}
        if unknown:
            parser.error(
                f"unknown workloads {sorted(unknown)}; the config has {[w.name for w in bench.workloads]}"
            )
        bench.workloads = [w for w in bench.workloads if w.name in args.workloads]
    for w in bench.workloads:
        if args.num_batches:
            w.num_batches = args.num_batches
            for p in w.grid:
                p.num_batches = args.num_batches
        if args.max_points:
            w.grid = w.grid[: args.max_points]
        if args.repeats:
            w.repeats = args.repeats
        if args.schedulers:
            w.schedulers = [s for s in w.schedulers if s in args.schedulers]
            for p in w.grid:
                if p.schedulers:
                    p.schedulers = [s for s in p.schedulers if s in args.schedulers]
            # A point whose own schedulers were all left out runs nothing (not the workload's list instead).
            w.grid = [
                p
                for p in w.grid
                if (p.schedulers if p.schedulers is not None else w.schedulers)
            ]
    if args.dry_run:
        for w in bench.workloads:
            for p in w.grid:
                for s in p.schedulers or w.schedulers:
                    c = pipeline_config(bench, w, p, s)
                    mode = {
                        "barrier": "barrier",
                        "replay": "per_env's requests again, bare loops in the driver",
                    }.get(s, f"mode {c.mode}, max_staleness {c.max_staleness}")
                    print(
                        f"{w.name:>14} {p.label:>14} {s:>12}: {p.num_envs} envs, batch {c.rollout_batch_size} x {c.num_batches}, {mode}"
                    )
        return 0
    out = claim_results(
        args.name or f"env_grouping_{device_kind()}_{bench.name}",
        plots=not args.no_plots,
        overwrite=args.overwrite,
    )
    result = asyncio.run(run_benchmark(bench))
    for path in write_results(result, out, plots=not args.no_plots):
        print(f"wrote {path}")
    saved = json.loads(out.path(".json").read_text())
    print("\n".join(headline(saved)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
