"""SWE rollouts on real workspaces: per-env loops vs a per-turn barrier vs ``first_complete``, same seeds.

An agent in a shell spends most of an episode in its workspace (container start, commands, the hidden
tests) and its episodes vary widely in length, so how the rollout is scheduled decides how many
trajectories a fixed set of containers yields. This benchmark plays the shipped swe tasks
(``roll_async/envs/swe``) in real workspaces (``--runtime docker`` or ``local``; default docker when a
daemon answers) with a scripted policy (``swe_policy.py``: the reference solution plus seeded, heavy-tailed
exploratory detours, each reply with seeded "thinking" prose) whose replies come from ``sim_engine.SimEngine``
(decode time calibrated by the engine ceiling result), and compares, on the same episode seeds:

* ``per_env``: the real rollout path in one process (``LocalRolloutScheduler``, ``GroupQueueManager``, one
  ``EnvManager`` per env), mode async with ``max_staleness = num_batches`` so loops never wait on a trainer;
* ``first_complete``: the same with ``serve_order: first_complete`` (the first groups to complete are
  served, whatever their age; slow groups continue into later batches);
* ``barrier``: ``barrier_rollout.BarrierRollout``, every env generates, then every env steps, each turn
  waiting for the slowest (NeMo-RL's multi-turn loop, RAGEN, verl-style agent rollouts).

Per run: trajectories/s, how busy the workspaces were (commands and tests ÷ the time they existed) and
how much of the env slots' time went to container start, commands, the verifier, closing, the policy and
waiting. Every scheduler runs ``--repeats`` times in alternating order; ratios are medians (min, max) of
the paired runs.

    python -m benchmarks.swe_rollout                           # docker if a daemon answers, else local
    python -m benchmarks.swe_rollout --runtime local --repeats 3 --num-batches 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from benchmarks.barrier_rollout import BarrierRollout
from benchmarks.common import RESULTS_DIR, ResultFiles, add_output_args, spread
from benchmarks.sim_engine import DecodeLatencyModel, SimEngine
from benchmarks.swe_policy import (
    BenchSweEnv,
    PlanConfig,
    ScriptedReplies,
    SpanKind,
    WorkspaceLedger,
)
from benchmarks.swe_report import to_markdown
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig, validate_config
from roll_async.envs.swe.env import SweConfig, load_tasks
from roll_async.model.paths import resolve_model_path
from roll_async.prompts.tokenizers import load_tokenizer
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.trajectory import GenerationRequest, GenerationResult, Trajectory
from roll_async.workspaces.factory import make_runtime
from roll_async.workspaces.interface import WorkspaceRuntime, WorkspaceSpec

SCHEDULERS = ("per_env", "first_complete", "barrier")
TAG = "Swe"
DEFAULT_CALIBRATION = RESULTS_DIR / "engine_ceiling_cpu.json"
#: The slot-time shares reported, in this order; ``idle`` is what is left (waiting on a barrier or a batch).
PHASES: tuple[str, ...] = (
    "start",
    "policy",
    "exec",
    "verifier",
    "close",
    "idle",
)


def docker_answers() -> bool:
    """Whether a Docker daemon answers (the default runtime is docker then)."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means: no daemon to use
        return False


def pick_runtime(requested: str) -> str:
    if requested != "auto":
        return requested
    return "docker" if docker_answers() else "local"


@dataclass
class TimedEngine:
    """The SimEngine with every generate call recorded as a ``policy`` span of the run's ledger."""

    engine: SimEngine
    ledger: WorkspaceLedger

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        began = time.monotonic()
        try:
            return await self.engine.generate(request)
        finally:
            self.ledger.add("policy", began, time.monotonic())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def pipeline_config(
    args: argparse.Namespace, runtime: str, scheduler: str
) -> PipelineConfig:
    """The PipelineConfig of one run (validated like any pipeline config)."""
    envs = args.num_env_groups * args.group_size
    data: dict[str, Any] = {
        "mode": "async",
        "max_staleness": max(1, args.num_batches),
        "rollout_batch_size": envs,
        "sequence_length": args.sequence_length,
        "num_batches": args.num_batches,
        "seed": args.seed,
        "model": {"path": args.model_path},
        "engine": {"max_model_len": args.sequence_length, "max_num_seqs": envs},
        "custom_envs": {
            TAG: {
                "env_type": "swe",
                "env_config": swe_env_config(args, runtime),
                "max_steps": args.max_turns,
                "max_tokens_per_step": 8192,
                "system_prompt": "You are a careful software engineer working in a Linux shell.",
                "instruction_template": "{instruction}\n{observation}",
                "observation_template": "{observation}",
                "stop": [],
            }
        },
        "train_env_manager": {
            "num_env_groups": args.num_env_groups,
            "group_size": args.group_size,
            "tags": [TAG],
            "max_env_num_per_worker": envs,
            "env_threads_per_worker": max(8, envs),
            "env_step_timeout_s": 600.0,
            "watchdog_timeout_s": 1800.0,
            "serve_order": "first_complete"
            if scheduler == "first_complete"
            else "fifo",
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
    assert isinstance(config, PipelineConfig)
    validate_config(config)
    return config


def swe_env_config(args: argparse.Namespace, runtime: str) -> dict[str, Any]:
    runtime_config: dict[str, Any] = (
        {"pool_size": args.pool_size} if runtime == "docker" else {}
    )
    return {
        "action_format": "text",
        "task_format": args.task_format,
        "task_ids": args.task_ids,
        "runtime": runtime,
        "runtime_config": runtime_config,
        "max_steps": args.max_turns,
        "command_timeout_s": 60.0,
        "max_observation_tokens": args.max_observation_tokens,
    }


def _make_runtime(runtime: str, args: argparse.Namespace) -> WorkspaceRuntime:
    """One runtime (one warm pool) for the run's envs, from the same settings a config would give."""
    return make_runtime(runtime, swe_env_config(args, runtime)["runtime_config"])


async def _warm(runtime: WorkspaceRuntime, swe: SweConfig) -> None:
    """Docker: fill the warm pool (and build images) before the clock starts, as a long run would have."""
    warm = getattr(runtime, "warm", None)
    if warm is None:
        return
    specs = {
        WorkspaceSpec(
            image=t.image,
            dockerfile=t.dockerfile,
            cpus=t.cpus,
            memory_mb=t.memory_mb,
            network=t.network,
            disk_mb=t.storage_mb,
        )
        for t in load_tasks(swe)
    }
    await asyncio.gather(*(warm(spec) for spec in specs))


async def run_one(
    args: argparse.Namespace,
    runtime_kind: str,
    scheduler: str,
    repeat: int,
    tokenizer: Any,
) -> dict[str, Any]:
    """One scheduler run on a fresh runtime; returns its record."""
    config = pipeline_config(args, runtime_kind, scheduler)
    swe = SweConfig(**config.custom_envs[TAG].env_config)
    tasks = load_tasks(swe)
    envs = args.num_env_groups * args.group_size
    ledger = WorkspaceLedger()
    runtime = _make_runtime(runtime_kind, args)
    await _warm(runtime, swe)
    special = set(tokenizer.all_special_ids)
    engine = SimEngine(
        DecodeLatencyModel.from_ceiling(args.calibration),
        max_num_seqs=envs,
        token_ids=[i for i in range(10, 600) if i not in special],
        time_scale=args.time_scale,
        replies=ScriptedReplies(tasks, tokenizer, args.plan, args.max_turns),
    )
    timed = TimedEngine(engine, ledger)

    def factory(tag: str, env_config: dict[str, Any]) -> BenchSweEnv:
        return BenchSweEnv(env_config, runtime=runtime, ledger=ledger)

    load_start = os.getloadavg()[0]
    trajectories: list[Trajectory] = []
    began = time.monotonic()
    try:
        if scheduler == "barrier":
            barrier = BarrierRollout(
                config, engine=timed, tokenizer=tokenizer, env_factory=factory
            )
            try:
                rounds = await barrier.collect(args.num_batches * envs)
                ended = time.monotonic()
                trajectories = [t for r in rounds for t in r.trajectories]
            finally:
                # the envs' close is async, which BarrierRollout.close (sync) cannot await
                for env in list(barrier._envs.values()):
                    await env.close()
                barrier._envs.clear()
                barrier.close()
        else:
            local = LocalRolloutScheduler(
                rollout_spec(config, "train"),
                engines=timed,
                tokenizer=tokenizer,
                env_factory=factory,
            )
            try:
                for step in range(args.num_batches):
                    trajectories += await local.get_batch(step)
                    print(
                        f"  [{scheduler} #{repeat}] batch {step + 1}/{args.num_batches} at "
                        f"{time.monotonic() - began:.1f}s",
                        file=sys.stderr,
                        flush=True,
                    )
                ended = time.monotonic()
            finally:
                await local.shutdown()
    finally:
        await runtime.shutdown()
        await engine.shutdown()
    return summarize_run(
        scheduler,
        repeat,
        trajectories,
        ledger,
        (began, ended),
        envs,
        load=(load_start, os.getloadavg()[0]),
    )


def summarize_run(
    scheduler: str,
    repeat: int,
    trajectories: list[Trajectory],
    ledger: WorkspaceLedger,
    window: tuple[float, float],
    envs: int,
    load: tuple[float, float],
) -> dict[str, Any]:
    """One run's figures: throughput, workspace utilisation and where the env slots' time went."""
    wall = window[1] - window[0]
    slot_s = envs * wall
    kinds: tuple[SpanKind, ...] = (
        "start",
        "policy",
        "exec",
        "verifier",
        "close",
        "open",
    )
    seconds = {kind: ledger.seconds(kind, window) for kind in kinds}
    shares = {
        k: seconds[k] / slot_s for k in ("start", "policy", "exec", "verifier", "close")
    }
    shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
    busy = seconds["exec"] + seconds["verifier"]
    latencies = sorted(t.finished_at - t.started_at for t in trajectories)
    turns = [len(t.turns) for t in trajectories]
    stops: dict[str, int] = {}
    for t in trajectories:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1

    def mean_span(kind: SpanKind) -> float:
        n = ledger.count(kind, window)
        return seconds[kind] / n if n else math.nan

    return {
        "scheduler": scheduler,
        "repeat": repeat,
        "envs": envs,
        "trajectories": len(trajectories),
        "wall_s": wall,
        "trajectories_per_s": len(trajectories) / wall if wall > 0 else math.nan,
        "success_rate": sum(t.episode_reward > 0 for t in trajectories)
        / max(1, len(trajectories)),
        "errors": sum(1 for t in trajectories if t.error),
        "stop_reasons": stops,
        "turns_mean": statistics.fmean(turns) if turns else math.nan,
        "turns_max": max(turns) if turns else 0,
        "episode_latency_p50_s": latencies[len(latencies) // 2]
        if latencies
        else math.nan,
        "episode_latency_max_s": latencies[-1] if latencies else math.nan,
        # workspace utilisation: commands + tests over the time workspaces existed
        "container_busy_fraction": busy / seconds["open"]
        if seconds["open"]
        else math.nan,
        # how much of the env slots' time a workspace existed at all
        "slot_occupancy": seconds["open"] / slot_s if slot_s else math.nan,
        "slot_share": shares,
        "seconds": seconds,
        "mean_s": {
            "start": mean_span("start"),
            "exec": mean_span("exec"),
            "verifier": mean_span("verifier"),
            "close": mean_span("close"),
            "policy_per_turn": mean_span("policy"),
        },
        "pool_hits": ledger.pool_hits,
        "workspace_starts": ledger.starts,
        "load1_start": round(load[0], 2),
        "load1_end": round(load[1], 2),
    }


def summarize(runs: list[dict[str, Any]], schedulers: list[str]) -> dict[str, Any]:
    """Per scheduler: the median (min, max) of each figure; per repeat, each scheduler ÷ the barrier."""
    out: dict[str, Any] = {"schedulers": {}, "vs_barrier": {}}
    for name in schedulers:
        mine = [r for r in runs if r["scheduler"] == name]
        if not mine:
            continue
        out["schedulers"][name] = {
            key: spread([float(r[key]) for r in mine])
            for key in (
                "trajectories_per_s",
                "container_busy_fraction",
                "slot_occupancy",
                "turns_mean",
                "episode_latency_p50_s",
                "success_rate",
            )
        } | {
            "slot_share": {
                phase: statistics.median(r["slot_share"][phase] for r in mine)
                for phase in PHASES
            },
            "mean_s": {
                key: statistics.median(r["mean_s"][key] for r in mine)
                for key in mine[0]["mean_s"]
            },
        }
    barrier = {r["repeat"]: r for r in runs if r["scheduler"] == "barrier"}
    for name in schedulers:
        if name == "barrier" or not barrier:
            continue
        ratios = [
            r["trajectories_per_s"] / barrier[r["repeat"]]["trajectories_per_s"]
            for r in runs
            if r["scheduler"] == name and r["repeat"] in barrier
        ]
        if ratios:
            out["vs_barrier"][name] = spread(ratios)
    return out


async def run_all(args: argparse.Namespace, runtime: str) -> list[dict[str, Any]]:
    tokenizer = load_tokenizer(args.model_path)
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        order = args.schedulers if repeat % 2 == 0 else args.schedulers[::-1]
        for scheduler in order:
            run = await run_one(args, runtime, scheduler, repeat, tokenizer)
            print(
                f"[{scheduler} #{repeat}] {run['trajectories']} trajectories in {run['wall_s']:.1f}s: "
                f"{run['trajectories_per_s']:.3f}/s, busy {run['container_busy_fraction']:.2f}, "
                f"success {run['success_rate']:.2f}, load {run['load1_end']}",
                flush=True,
            )
            runs.append(run)
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--runtime",
        choices=["auto", "docker", "local"],
        default="auto",
        help="workspace runtime (auto: docker when a daemon answers, else local)",
    )
    parser.add_argument("--task-format", choices=["swe", "harbor"], default="swe")
    parser.add_argument(
        "--task-ids", nargs="+", default=None, help="only these tasks (default: all 35)"
    )
    parser.add_argument("--num-env-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument(
        "--num-batches",
        type=int,
        default=3,
        help="batches of num_env_groups x group_size trajectories per run",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--schedulers", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS)
    )
    parser.add_argument(
        "--max-turns", type=int, default=16, help="max_steps of the env and the rollout"
    )
    parser.add_argument(
        "--pool-size", type=int, default=2, help="docker: warm containers per spec"
    )
    parser.add_argument("--max-observation-tokens", type=int, default=512)
    parser.add_argument("--sequence-length", type=int, default=32768)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--calibration",
        default=str(DEFAULT_CALIBRATION),
        help="engine ceiling result the simulated policy's decode time comes from",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="> 1 runs the simulated policy faster than calibrated",
    )
    parser.add_argument("--detour-alpha", type=float, default=PlanConfig.detour_alpha)
    parser.add_argument("--max-detours", type=int, default=PlanConfig.max_detours)
    parser.add_argument(
        "--think-words", type=float, default=PlanConfig.think_words_median
    )
    parser.add_argument(
        "--model", default=None, help="tokenizer (default: the offline tiny model)"
    )
    add_output_args(parser, name_default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.num_batches < 1 or args.max_turns < 2:
        parser.error("--repeats and --num-batches must be >= 1, --max-turns >= 2")
    args.plan = PlanConfig(
        detour_alpha=args.detour_alpha,
        max_detours=args.max_detours,
        think_words_median=args.think_words,
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runtime = pick_runtime(args.runtime)
    files = ResultFiles.claim(
        args.name or f"swe_rollout_{runtime}",
        [".json", ".md"],
        overwrite=args.overwrite,
    )
    args.model_path = resolve_model_path(args.model)
    started = time.monotonic()
    runs = asyncio.run(run_all(args, runtime))
    summary = summarize(runs, args.schedulers)
    payload = {
        "benchmark": "swe_rollout",
        "runtime": runtime,
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in ("plan", "overwrite", "name")
        }
        | {"plan": dataclasses.asdict(args.plan)},
        "total_wall_s": time.monotonic() - started,
        "summary": summary,
        "runs": runs,
    }
    stamped = json.loads(files.write_json(payload).read_text())
    files.write_text(".md", to_markdown(stamped))
    print(f"wrote {files.path('.json')} and {files.path('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
