"""Async ÷ sync training-step throughput with a SIMULATED trainer on the long-tail workload.

The whole AgenticPipeline runs (real engine, real Ray, real RolloutScheduler, real
weight-sync pauses and versions); only the trainer is ``trainer.simulate_step_s``
(``roll_async/trainer/simulated.py``: each step takes that long without CPU, the
version advances, ``simulate_sync_s`` per weight sync). So the ratio is what async
overlap buys for a given step time, without a real trainer competing with the
CPU engine for the machine's two cores.

Runs alternate sync / async (ABBA... ``--repeats`` times each) on one engine. Step
throughput of a run = steps after the first ÷ their summed ``time/step_total``
(the first step includes the env loops' start). ``--step-s auto`` sets the
simulated step time to the median per-step rollout time of a first sync
calibration run ("a step time comparable to the rollout time").

    python -m benchmarks.async_speedup                       # quick: 6 steps per run, 3 runs each
    python -m benchmarks.async_speedup --step-s 4 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ResultFiles, add_output_args, spread

LONGTAIL_ENV = {
    "min_turns": 1,
    "max_turns": 12,
    "turns_alpha": 1.2,
    "step_latency_s": 0.2,
    "step_latency_sigma": 1.0,
    "max_step_latency_s": 5.0,
    "slow_step_prob": 0.02,
    "slow_step_s": 3.0,
    "observation_words": 12,
    "observation_words_sigma": 0.5,
}


def bench_config(
    mode: str, args: argparse.Namespace, step_s: float, output_dir: str
) -> Any:
    from roll_async.config.schema import (
        CustomEnvConfig,
        EngineConfig,
        EnvManagerConfig,
        LoggingConfig,
        PipelineConfig,
        validate_config,
    )

    config = PipelineConfig(
        mode=mode,
        max_staleness=args.max_staleness if mode == "async" else None,
        rollout_batch_size=args.groups * args.group_size,
        sequence_length=1536,
        max_steps=args.steps,
        seed=args.seed,
        output_dir=output_dir,
        engine=EngineConfig(
            dtype="float32",
            max_model_len=2048,
            max_num_seqs=64,
            cpu_kv_cache_space_gib=0.5,
        ),
        custom_envs={
            "LongTail": CustomEnvConfig(
                env_type="longtail",
                env_config=dict(LONGTAIL_ENV),
                max_steps=12,
                max_tokens_per_step=64,
                stop=[">", ".", ","],
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=args.groups,
            group_size=args.group_size,
            tags=["LongTail"],
            max_env_num_per_worker=args.groups * args.group_size,
            env_threads_per_worker=args.groups * args.group_size,
            serve_order=args.serve_order,
        ),
        logging=LoggingConfig(
            console=False, progress_bar=False, save_trajectories=False
        ),
    )
    config.trainer.simulate_step_s = step_s
    config.trainer.simulate_sync_s = args.sync_s
    validate_config(config)
    return config


async def run_once(
    mode: str, args: argparse.Namespace, step_s: float, engine: Any
) -> dict[str, Any]:
    from roll_async.pipelines.agentic_pipeline import AgenticPipeline

    with tempfile.TemporaryDirectory() as tmp:
        config = bench_config(mode, args, step_s, tmp)
        started = time.perf_counter()
        run_dir = await AgenticPipeline(config, engines=[engine]).run()
        wall = time.perf_counter() - started
        rows = [
            json.loads(line)
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
            if line.strip()
        ]
    rows = sorted((r for r in rows if "time/step_total" in r), key=lambda r: r["step"])
    measured = rows[1:]  # the first step includes starting the env loops
    total = sum(r["time/step_total"] for r in measured)
    return {
        "mode": mode,
        "steps_measured": len(measured),
        "steps_per_s": len(measured) / total if total > 0 else float("nan"),
        "step_total_s_median": statistics.median(
            r["time/step_total"] for r in measured
        ),
        "rollout_wait_s_median": statistics.median(
            r["time/step_rollout"] for r in measured
        ),
        "env_busy_fraction_mean": statistics.fmean(
            r.get("rollout/env_busy_fraction", float("nan")) for r in measured
        ),
        "staleness_mean": statistics.fmean(
            r.get("rollout/staleness/mean", 0.0) for r in measured
        ),
        "dropped_stale_groups": sum(
            r.get("rollout/dropped_stale_groups", 0.0) for r in measured
        ),
        "trajectories_per_s_served": statistics.fmean(
            r.get("rollout/trajectories_per_s", 0.0) for r in measured
        ),
        "wall_s": wall,
        "load1": round(os.getloadavg()[0], 2),
    }


async def main_async(
    args: argparse.Namespace, out: ResultFiles | None = None
) -> dict[str, Any]:
    import ray

    from roll_async.engine.engine_actor import launch_engines, shutdown_engines
    from roll_async.model.paths import resolve_model_path
    from roll_async.runtime.ray_utils import init_ray

    init_ray(None, None)
    model_path = resolve_model_path(args.model)
    engine_config = bench_config("sync", args, 1.0, "/tmp").engine
    (engine,) = await launch_engines(
        model_path, engine_config, name_prefix="async_speedup_engine"
    )
    runs: list[dict[str, Any]] = []
    try:
        step_s = args.step_s
        if step_s == "auto":
            calibration = await run_once("sync", args, 0.01, engine)
            step_s = round(calibration["rollout_wait_s_median"], 2)
            calibration["role"] = "calibration (not counted)"
            runs.append(calibration)
            print(
                f"calibration: sync rollout per step {step_s:.2f}s -> simulate_step_s={step_s}",
                flush=True,
            )
        step_s = float(step_s)
        order = []
        for i in range(args.repeats):
            order += ["sync", "async"] if i % 2 == 0 else ["async", "sync"]
        for mode in order:
            result = await run_once(mode, args, step_s, engine)
            result["role"] = "measured"
            runs.append(result)
            if out is not None:
                out.write_json(
                    {"partial": True, "simulate_step_s": step_s, "runs": runs},
                    "_partial.json",
                )
            print(
                f"{mode:>5}: {result['steps_per_s']:.3f} steps/s (step {result['step_total_s_median']:.2f}s, "
                f"rollout wait {result['rollout_wait_s_median']:.2f}s, load {result['load1']})",
                flush=True,
            )
    finally:
        await shutdown_engines([engine])
        ray.shutdown()
    measured = [r for r in runs if r["role"] == "measured"]
    sync = [r["steps_per_s"] for r in measured if r["mode"] == "sync"]
    asyn = [r["steps_per_s"] for r in measured if r["mode"] == "async"]
    # Pairwise ratios of adjacent runs (ABBA pairs) and the ratio of medians.
    ratios = [a / s for s, a in zip(sync, asyn)]
    return {
        "simulated_trainer": True,
        "simulate_step_s": step_s,
        "simulate_sync_s": args.sync_s,
        "workload": {
            "env": "longtail",
            "env_config": LONGTAIL_ENV,
            "groups": args.groups,
            "group_size": args.group_size,
            "max_staleness": args.max_staleness,
            "serve_order": args.serve_order,
            "steps_per_run": args.steps,
        },
        "sync_steps_per_s": spread(sync),
        "async_steps_per_s": spread(asyn),
        "async_vs_sync": statistics.median(asyn) / statistics.median(sync),
        "async_vs_sync_pairwise": spread(ratios),
        "runs": runs,
    }


def to_markdown(result: dict[str, Any]) -> str:
    s, a, p = (
        result["sync_steps_per_s"],
        result["async_steps_per_s"],
        result["async_vs_sync_pairwise"],
    )
    lines = [
        "# Async ÷ sync step throughput, SIMULATED trainer, long-tail workload",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}  ",
        f"Load (1-min average at the end of each run): {[r['load1'] for r in result['runs']]}",
        "",
        f"simulate_step_s = {result['simulate_step_s']} s, simulate_sync_s = {result['simulate_sync_s']} s; "
        f"workload {json.dumps(result['workload'])}",
        "",
        "| | steps/s median | min | max | runs |",
        "|---|---:|---:|---:|---:|",
        f"| sync | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} | {s['n']} |",
        f"| async | {a['median']:.3f} | {a['min']:.3f} | {a['max']:.3f} | {a['n']} |",
        f"| **async ÷ sync** | **{result['async_vs_sync']:.2f}x** (ratio of medians) | pairwise {p['min']:.2f}x | {p['max']:.2f}x | {p['n']} pairs |",
        "",
        "| run | mode | steps/s | step s (median) | get_batch wait s (median) | env busy | staleness | dropped stale groups | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(result["runs"]):
        lines.append(
            f"| {i} | {r['mode']}{' (calibration)' if r['role'] != 'measured' else ''} | {r['steps_per_s']:.3f} | "
            f"{r['step_total_s_median']:.2f} | {r['rollout_wait_s_median']:.2f} | {r['env_busy_fraction_mean']:.2f} | "
            f"{r['staleness_mean']:.2f} | {r['dropped_stale_groups']:.0f} | {r['load1']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--step-s",
        default="auto",
        help="simulated train step seconds, or 'auto' (sync rollout time)",
    )
    parser.add_argument(
        "--sync-s", type=float, default=0.2, help="simulated weight sync seconds"
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument(
        "--serve-order", default="fifo", choices=["fifo", "first_complete"]
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--model", default=None)
    add_output_args(parser, name_default="async_speedup_cpu")
    args = parser.parse_args(argv)
    out = ResultFiles.claim(
        args.name, [".json", ".md", "_partial.json"], overwrite=args.overwrite
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = asyncio.run(main_async(args, out))
    path = out.write_json(result)
    out.path("_partial.json").unlink(missing_ok=True)
    saved = json.loads(path.read_text())
    out.write_text(".md", to_markdown(saved))
    print(
        f"async ÷ sync: {result['async_vs_sync']:.2f}x; wrote {path} and {path.with_suffix('.md')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
