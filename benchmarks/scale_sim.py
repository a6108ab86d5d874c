"""Scale by SIMULATION: the real scheduler and EnvManagers with 1,000 and 10,000 envs on a simulated engine.

The engine is ``benchmarks.sim_engine.SimEngine`` (no model; decode-step time
vs concurrency calibrated from the recorded engine ceiling). Everything else is
the real rollout path, in one process: LocalRolloutScheduler, the
GroupQueueManager, one EnvManager per env instance with the real
ChatPromptBuilder on the tiny model's tokenizer, and a cheap env (LongTailEnv
with no latency: Pareto turn counts 1..8, short observations) whose sync steps
go through the env thread pool like any env's.

Reported per env count (each in a fresh subprocess, so memory deltas are clean):

* rollout-side CPU per trajectory and per turn: process CPU time
  (``time.process_time``, all threads) minus the simulator's own bookkeeping
  CPU, over the steady-state batches (the first batch, when all envs are built
  and first reset, is reported separately as start-up CPU per env). Sleeping
  (simulated decode) costs no CPU, so nothing else needs subtracting.
* memory per env: RSS growth / envs after the scheduler was built, and at the
  peak while running (every env built, mid-episode, with its conversation).
* simulated throughput: trajectories/s and tokens/s against the model's own
  ceiling at the concurrency the engine actually ran (``tokens_vs_sim_ceiling``).

    python -m benchmarks.scale_sim                          # 1,000 and 10,000 envs
    python -m benchmarks.scale_sim --envs 1000 --calibration benchmarks/results/engine_ceiling_gpu.json
    python -m benchmarks.env_grouping --simulate [same flags]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ResultFiles, add_output_args, spread
from benchmarks.sim_engine import DecodeLatencyModel

DEFAULT_CALIBRATION = RESULTS_DIR / "engine_ceiling_cpu.json"


def _rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # Linux fallback
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class QueueCpuMeter:
    """CPU time (``time.thread_time`` of the event-loop thread) spent inside the GroupQueueManager's methods.

    Each coroutine of ``next_episode`` / ``put_trajectory`` / ``get_batch`` is driven step by step and only its
    own steps are timed (not the time it sleeps waiting for a seat or a batch), so this is the scheduler proper:
    seat assignment, wake-ups, completion, readiness, serving, and the cancellation callbacks it makes.
    """

    def __init__(self, queue: Any) -> None:
        self.cpu_s = 0.0
        for name in ("next_episode", "put_trajectory", "get_batch"):
            method = getattr(queue, name)
            setattr(queue, name, self._timed(method))

    def _timed(self, method: Any) -> Any:
        meter = self

        class _Timed:
            def __init__(self, coro: Any) -> None:
                self.coro = coro

            def __await__(self) -> Any:
                coro, value, error = self.coro, None, None
                while True:
                    started = time.thread_time()
                    try:
                        yielded = (
                            coro.throw(error) if error is not None else coro.send(value)
                        )
                    except StopIteration as stop:
                        meter.cpu_s += time.thread_time() - started
                        return stop.value
                    except BaseException:
                        meter.cpu_s += time.thread_time() - started
                        raise
                    meter.cpu_s += time.thread_time() - started
                    try:
                        value, error = (yield yielded), None
                    except BaseException as exc:
                        # cancellation is thrown into the coroutine
                        value, error = None, exc

        def call(*args: Any, **kwargs: Any) -> Any:
            return _Timed(method(*args, **kwargs))

        return call


def sim_pipeline_config(num_envs: int, args: argparse.Namespace) -> Any:
    from roll_async.config.schema import (
        CustomEnvConfig,
        EngineConfig,
        EnvManagerConfig,
        PipelineConfig,
        validate_config,
    )

    group_size = args.group_size
    if num_envs % group_size:
        raise ValueError(
            f"--envs {num_envs} must be a multiple of --group-size {group_size}"
        )
    num_env_groups = num_envs // group_size
    batch = max(
        group_size, (num_envs // args.batches_per_envs) // group_size * group_size
    )
    groups_per_batch = batch // group_size
    # every env can always find a seat
    staleness = math.ceil(num_env_groups / groups_per_batch) + 2
    config = PipelineConfig(
        mode="async",
        max_staleness=staleness,
        rollout_batch_size=batch,
        sequence_length=1024,
        num_batches=max(2, math.ceil(args.trajectories_per_env * num_envs / batch)),
        seed=7,
        engine=EngineConfig(max_model_len=2048, max_num_seqs=args.max_num_seqs),
        custom_envs={
            "SimTail": CustomEnvConfig(
                env_type="longtail",
                env_config={
                    "min_turns": 1,
                    "max_turns": 8,
                    "turns_alpha": 1.2,
                    "observation_words": 8,
                    "observation_words_sigma": 0.5,
                },
                max_steps=8,
                max_tokens_per_step=args.max_tokens,
                stop=[],
                isolation=args.isolation,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=num_env_groups,
            group_size=group_size,
            tags=["SimTail"],
            max_env_num_per_worker=num_envs,
            env_threads_per_worker=8,
            watchdog_timeout_s=3600.0,
        ),
    )
    validate_config(config)
    return config


def _warm_up(config: Any, tokenizer: Any) -> None:
    """One prompt build, decode and env episode, so one-time imports are paid before measuring."""
    from roll_async.envs import make_env
    from roll_async.prompts.prompt_builder import ChatPromptBuilder

    spec = config.custom_envs["SimTail"]
    builder = ChatPromptBuilder(tokenizer, spec.system_prompt)
    env = make_env(spec.env_type, dict(spec.env_config))
    observation, info = env.reset(1)
    ids = builder.first_turn_ids(
        spec.instruction_template.format(
            instruction=info["instruction"], observation=observation
        )
    )
    text = builder.decode(ids[-8:])
    observation, *_ = env.step(text)
    builder.closure_ids_after(ids[-8:]) + builder.user_delta_ids(observation)


async def run_one(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    """One scale point in this process."""
    from benchmarks.sim_engine import SimEngine
    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.model.paths import resolve_model_path
    from roll_async.prompts.tokenizers import load_tokenizer
    from roll_async.runtime.gc_tuning import tune_gc_for_env_loops
    from roll_async.scheduler.local import LocalRolloutScheduler

    tokenizer = load_tokenizer(resolve_model_path(args.model))
    special = set(tokenizer.all_special_ids)
    token_ids = [i for i in range(10, min(len(tokenizer), 600)) if i not in special]
    model = DecodeLatencyModel.from_ceiling(args.calibration)
    engine = SimEngine(
        model,
        max_num_seqs=args.max_num_seqs,
        output_len_mean=args.output_len_mean,
        token_ids=token_ids,
        time_scale=args.time_scale,
    )
    config = sim_pipeline_config(num_envs, args)
    _warm_up(
        config, tokenizer
    )  # lazy imports and first-call costs are not per-trajectory costs

    rss_base = _rss_bytes()
    cpu_build0 = time.process_time()
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"), engines=engine, tokenizer=tokenizer
    )
    build_cpu = time.process_time() - cpu_build0
    # This process stands for an EnvManagerWorker (it hosts the env loops only), so it takes a worker's GC settings.
    tune_gc_for_env_loops(config.train_env_manager.worker_gc_threshold)
    queue_meter = QueueCpuMeter(scheduler.group_queue)
    rss_built = _rss_bytes()
    peak = [rss_built]
    in_flight: list[float] = []

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], _rss_bytes())
            in_flight.append(len(engine._running))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    served = 0

    def mark() -> dict[str, float]:
        return {
            "wall": time.perf_counter(),
            "cpu": time.process_time(),
            "engine_cpu": engine.cpu_s,
            "sim_time": engine.sim_time_s,
            "tokens": engine.generation_tokens,
            "requests": engine.finished_requests,
            "episodes": sum(m.stats.episodes for m in scheduler.managers),
            "env_cpu": sum(m.stats.env_cpu_s for m in scheduler.managers),
            "queue_cpu": queue_meter.cpu_s,
            "seat_wakeups": scheduler.group_queue.wakeups.seat,
            "seat_events": scheduler.group_queue.wakeups.seat_events,
        }

    start = mark()
    marks: list[dict[str, float]] = []
    try:
        for step in range(config.num_batches):
            batch = await scheduler.get_batch(step)
            served += len(batch)
            marks.append(mark())
            print(
                f"  {num_envs} envs: batch {step + 1}/{config.num_batches} ({len(batch)} traj) at "
                f"{marks[-1]['wall'] - start['wall']:.1f}s wall",
                file=sys.stderr,
                flush=True,
            )
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await scheduler.shutdown()
        await engine.shutdown()
    # Work is counted where it happened (episodes the EnvManagers finished, requests the engine finished), not by
    # what get_batch served: async env loops run up to max_staleness batches ahead. Episodes still in flight at
    # the end cost CPU but are not counted, so the per-trajectory figures err high.
    # The whole run after the scheduler was built: each env's first build and reset included (a one-off that a
    # long run amortises; --trajectories-per-env sets how many episodes share it).
    last = marks[-1]
    d = whole = {k: last[k] - start[k] for k in last}
    rollout_cpu = d["cpu"] - d["engine_cpu"]
    # the env's own calls (LongTailEnv drawing text) are not the scheduler's
    scheduler_cpu = rollout_cpu - d["env_cpu"]
    mean_running = sum(in_flight) / len(in_flight) if in_flight else 0.0
    # The model's throughput at the batch the engine ran, in wall time (time_scale speeds the simulated clock up).
    sim_ceiling = (
        model.tokens_per_s(mean_running) * args.time_scale
        if mean_running > 0
        else math.nan
    )
    engine_tokens_per_s = (
        whole["tokens"] / whole["wall"] if whole["wall"] > 0 else math.nan
    )
    return {
        "num_envs": num_envs,
        "group_size": config.train_env_manager.group_size,
        "num_env_groups": config.train_env_manager.num_env_groups,
        "rollout_batch_size": config.rollout_batch_size,
        "num_batches": config.num_batches,
        "max_staleness": config.max_staleness,
        "served_trajectories": served,
        "episodes": d["episodes"],
        "turns": d["requests"],
        "wall_s": whole["wall"],
        "build_cpu_ms_per_env": 1000 * build_cpu / num_envs,
        "process_cpu_s": d["cpu"],
        "sim_engine_cpu_s": d["engine_cpu"],
        # The whole rollout side (queue + env loops + prompt building + env thread hops + the env's own calls).
        "rollout_cpu_us_per_trajectory": 1e6 * rollout_cpu / d["episodes"]
        if d["episodes"]
        else math.nan,
        # The env's own sync calls (CPU of the thread that ran them; EnvManagerStats.env_cpu_s).
        "env_cpu_us_per_trajectory": 1e6 * d["env_cpu"] / d["episodes"]
        if d["episodes"]
        else math.nan,
        # The rollout side without the env's own work: queue, env loops, prompt building, thread hops, routing.
        "scheduler_cpu_us_per_trajectory": 1e6 * scheduler_cpu / d["episodes"]
        if d["episodes"]
        else math.nan,
        # The GroupQueueManager alone (QueueCpuMeter).
        "queue_cpu_us_per_trajectory": 1e6 * d["queue_cpu"] / d["episodes"]
        if d["episodes"]
        else math.nan,
        "seat_wakeups_per_trajectory": d["seat_wakeups"] / d["episodes"]
        if d["episodes"]
        else math.nan,
        "scheduler_cpu_us_per_turn": 1e6 * scheduler_cpu / d["requests"]
        if d["requests"]
        else math.nan,
        "scheduler_cpu_share_of_wall": rollout_cpu / d["wall"]
        if d["wall"] > 0
        else math.nan,
        "max_trajectories_per_cpu_s": d["episodes"] / rollout_cpu
        if rollout_cpu > 0
        else math.nan,
        "rss_base_mb": rss_base / 2**20,
        "rss_kb_per_env_built": (rss_built - rss_base) / 1024 / num_envs,
        "rss_kb_per_env_peak": (peak[0] - rss_base) / 1024 / num_envs,
        "trajectories_per_s_wall": d["episodes"] / d["wall"]
        if d["wall"] > 0
        else math.nan,
        "engine_tokens_per_s_wall": engine_tokens_per_s,
        "sim_mean_running": mean_running,
        "sim_ceiling_tokens_per_s": sim_ceiling,
        "tokens_vs_sim_ceiling": engine_tokens_per_s / sim_ceiling
        if sim_ceiling and not math.isnan(sim_ceiling)
        else math.nan,
        "sim_engine_busy_fraction": whole["sim_time"]
        / (whole["wall"] * args.time_scale)
        if whole["wall"] > 0
        else math.nan,
        "turns_mean": d["requests"] / d["episodes"] if d["episodes"] else math.nan,
        "time_scale": args.time_scale,
        "isolation": args.isolation,
        "load1_end": round(os.getloadavg()[0], 2),
    }


def _child_main(args: argparse.Namespace) -> int:
    result = asyncio.run(run_one(args.child, args))
    Path(args.child_out).write_text(json.dumps(result))
    return 0


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Scale by SIMULATION: the real scheduler + EnvManagers on a simulated engine",
        "",
        "**This is a simulation.** The engine is `benchmarks/sim_engine.py` (no model): each decode step advances every "
        "running request by one token and takes the time the engine ceiling benchmark measured at that concurrency "
        f"(calibration: `{result['calibration']}`, seconds per step at N: "
        + ", ".join(
            f"{p['concurrency']:g}: {p['decode_step_s'] * 1000:.1f} ms"
            for p in result.get("calibration_points", [])
        )
        + f"; max_num_seqs {result['max_num_seqs']}, output length geometric with "
        f"mean {result['output_len_mean']}, time_scale {result['time_scale']}). The scheduler side is real: "
        "LocalRolloutScheduler, GroupQueueManager, one EnvManager per env, ChatPromptBuilder on the tiny model's tokenizer, "
        "LongTailEnv with no latency (Pareto turns 1..8) in the env thread pool.",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}; 1-minute load average at the end of each run: "
        f"{[r.get('load1_end') for r in result['rows']]} (CPU figures are process CPU time: less affected by other work than wall times, not immune)",
        "",
        "| envs | isolation | episodes | turns/episode | scheduler CPU µs / traj | queue CPU µs / traj | env CPU µs / traj | rollout CPU µs / traj | seat wake-ups / traj | scheduler CPU µs / turn | CPU share of wall | traj per CPU-s | KB / env built | KB / env peak | sim engine tok/s ÷ its ceiling | sim engine busy | wall s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = result.get("summary") or []
    if summary:
        lines[-2:-2] = [
            "Medians over the runs of each env count (min–max):",
            "",
            "| envs | runs | scheduler CPU µs / traj | queue CPU µs / traj | env CPU µs / traj | rollout CPU µs / traj |",
            "|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {e['num_envs']:,} | {e['runs']} | "
                + " | ".join(
                    f"**{e[k]['median']:.0f}** ({e[k]['min']:.0f}–{e[k]['max']:.0f})"
                    if k in e
                    else "–"
                    for k in (
                        "scheduler_cpu_us_per_trajectory",
                        "queue_cpu_us_per_trajectory",
                        "env_cpu_us_per_trajectory",
                        "rollout_cpu_us_per_trajectory",
                    )
                )
                + " |"
                for e in summary
            ),
            "",
            "Every run:",
            "",
        ]
    for r in result["rows"]:
        lines.append(
            f"| {r['num_envs']:,} | {r.get('isolation', 'none')} | {r['episodes']:,} | {r['turns_mean']:.2f} | {r['scheduler_cpu_us_per_trajectory']:.0f} | "
            f"{r.get('queue_cpu_us_per_trajectory', float('nan')):.0f} | {r.get('env_cpu_us_per_trajectory', float('nan')):.0f} | "
            f"{r.get('rollout_cpu_us_per_trajectory', float('nan')):.0f} | {r.get('seat_wakeups_per_trajectory', float('nan')):.2f} | "
            f"{r['scheduler_cpu_us_per_turn']:.0f} | {r['scheduler_cpu_share_of_wall']:.2f} | {r['max_trajectories_per_cpu_s']:.0f} | "
            f"{r['rss_kb_per_env_built']:.1f} | {r['rss_kb_per_env_peak']:.1f} | {r['tokens_vs_sim_ceiling']:.2f} | "
            f"{r['sim_engine_busy_fraction']:.2f} | {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        "queue CPU µs / traj: the GroupQueueManager alone (its coroutines' own steps, `time.thread_time`; "
        "`QueueCpuMeter`); seat wake-ups / traj: env loops woken while waiting for a seat. "
        "rollout CPU µs / traj: process CPU (all threads) minus the simulator's own bookkeeping, per episode the "
        "EnvManagers finished, over the whole run after the scheduler was built (each env's first build and reset "
        "included, shared by --trajectories-per-env episodes; episodes still in flight at the end are not counted, so "
        "the figures err high); env CPU µs / traj: the "
        "env's own calls (CPU of the thread that ran each, `EnvManagerStats.env_cpu_s`); scheduler CPU µs / traj (/ turn): "
        "rollout minus env: queue, env loops, prompt building, routing, thread hops (field "
        "`scheduler_cpu_us_per_trajectory`; older result files counted the env's own work in it). CPU share of "
        "wall: that CPU over the same wall time (1.0 = one core saturated, the rollout side would be the bottleneck); "
        "traj per CPU-s: trajectories one core can drive at that cost. KB / env: RSS growth over envs, after building "
        "the scheduler and at the peak while running (every env built, mid-episode). sim engine tok/s ÷ its ceiling: "
        "tokens the simulated engine generated per wall second over the model's own throughput (x time_scale) at its mean "
        "running batch; sim engine busy: simulated time with requests running over wall time x time_scale. Below 1, the "
        "engine waited for requests: the one event loop that hosts every env loop here did not feed it fast enough "
        "(the engine keeps its own clock, so a busy loop delays only its inputs and outputs).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--batches-per-envs",
        type=int,
        default=4,
        help="rollout_batch_size = envs / this",
    )
    parser.add_argument(
        "--trajectories-per-env",
        type=float,
        default=1.0,
        help="trajectories collected per env instance",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=1024, help="simulated engine batch limit"
    )
    parser.add_argument("--output-len-mean", type=float, default=12.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=4.0,
        help="simulated seconds per wall second: 4 = the calibrated engine sped up 4x (1: as measured)",
    )
    parser.add_argument(
        "--calibration",
        default=str(DEFAULT_CALIBRATION),
        help="engine ceiling JSON to calibrate from",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="tokenizer's model dir (default: the offline tiny model)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per env count (each a fresh subprocess)",
    )
    parser.add_argument(
        "--isolation",
        default="inline",
        choices=["inline", "none"],
        help="custom_envs.SimTail.isolation: inline (env calls on the event loop; the env takes "
        "microseconds) or none (the worker's env threads)",
    )
    add_output_args(parser, name_default=None, plots=True)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.child is not None:
        return _child_main(args)
    device = "gpu" if "gpu" in Path(args.calibration).stem else "cpu"
    results = ResultFiles.claim(
        args.name or f"scale_sim_{device}",
        [".json", ".md", ".csv"] + ([] if args.no_plots else [".png"]),
        overwrite=args.overwrite,
    )
    rows = []
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for n in [n for n in args.envs for _ in range(args.repeats)]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.scale_sim",
                *_strip_envs(passthrough),
                "--child",
                str(n),
                "--child-out",
                str(out),
            ]
            print(f"simulating {n:,} envs ...", flush=True)
            started = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parent.parent)
            row = json.loads(out.read_text())
            rows.append(row)
            print(
                f"{n:>6,} envs: {row['scheduler_cpu_us_per_trajectory']:.0f} µs CPU/trajectory "
                f"({row['scheduler_cpu_us_per_turn']:.0f} µs/turn), {row['rss_kb_per_env_peak']:.1f} KB/env peak, "
                f"{row['rss_kb_per_env_built']:.1f} KB/env built, {time.perf_counter() - started:.0f}s",
                flush=True,
            )
    result = {
        "simulation": True,
        "calibration": args.calibration
        if not Path(args.calibration).is_absolute()
        else os.path.relpath(args.calibration, Path(__file__).resolve().parent.parent),
        "calibration_points": [
            {"concurrency": c, "decode_step_s": t}
            for c, t in zip(
                *(lambda m: (m.concurrency, m.step_s))(
                    DecodeLatencyModel.from_ceiling(args.calibration)
                )
            )
        ],
        "max_num_seqs": args.max_num_seqs,
        "output_len_mean": args.output_len_mean,
        "time_scale": args.time_scale,
        "isolation": args.isolation,
        "rows": rows,
        "summary": summarize_repeats(rows),
    }
    path = results.write_json(result)
    saved = json.loads(path.read_text())
    results.write_text(".md", to_markdown(saved))
    with results.path(".csv").open("w", newline="") as f:
        f.write(
            f"# SIMULATION. command: {saved['command']}\n# recorded: {saved['recorded_at']}\n# machine: {json.dumps(saved['machine'])}\n"
        )
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    written = [path, results.path(".md"), results.path(".csv")]
    if not args.no_plots:
        from benchmarks.grouping_plots import plot_scale

        title = f"SIMULATION (engine calibrated from {saved['calibration']}) | {saved['machine'].get('cpu_model')} x{saved['machine'].get('cpu_count')} | {saved['command']}"
        written.append(plot_scale(rows, results.path(".png"), title))
    for p in written:
        print(f"wrote {p}")
    return 0


def summarize_repeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per env count: median, min and max over the runs of the CPU figures."""
    out = []
    for n in sorted({r["num_envs"] for r in rows}):
        runs = [r for r in rows if r["num_envs"] == n]
        entry: dict[str, Any] = {"num_envs": n, "runs": len(runs)}
        for key in (
            "scheduler_cpu_us_per_trajectory",
            "queue_cpu_us_per_trajectory",
            "env_cpu_us_per_trajectory",
            "rollout_cpu_us_per_trajectory",
            "seat_wakeups_per_trajectory",
            "tokens_vs_sim_ceiling",
        ):
            values = [r[key] for r in runs if key in r]
            if values:
                entry[key] = spread(values)
        out.append(entry)
    return out


def _strip_envs(argv: list[str]) -> list[str]:
    """The parent's arguments minus --envs and its values (each child gets one env count)."""
    out, skipping = [], False
    for a in argv:
        if a == "--envs":
            skipping = True
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
