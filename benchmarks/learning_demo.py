"""The offline learning demo: SFT warm start on partial expert demos, then GRPO, in sync and async mode.

A random tiny model cannot act, so each run first fine-tunes it briefly on a
few *partial* expert demonstrations from the env's solver (the answer format
and the first moves, not whole solutions: initial success stays low), then
trains it with GRPO. The demo runs the same config once per mode
(``mode=sync`` and ``mode=async max_staleness=1``, same seed otherwise) through
the real CLI (``roll-async train``: vLLM engine, Ray env workers, trainer),
reads each run's ``metrics.jsonl`` and records success rate and mean episode
reward per step: a JSON and a markdown table (first-k vs last-k means) and a
PNG plot (raw and smoothed curves) in ``benchmarks/results/``.

    python -m benchmarks.learning_demo                      # the recorded demo (both modes)
    python -m benchmarks.learning_demo --quick              # a short run (~6 min): learning_demo_quick.*
    python -m benchmarks.learning_demo --modes sync --steps 40 --set trainer.lr=1e-3
    python -m benchmarks.learning_demo --from-runs sync=RUN_DIR async=RUN_DIR   # re-record without training
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, ResultFiles, add_output_args, nan_mean, run_train

DEFAULT_CONFIG = "configs/demo_learn_frozen_lake.yaml"
MODE_OVERRIDES = {"sync": ["mode=sync"], "async": ["mode=async", "max_staleness=1"]}
REWARD_KEY = "rollout/episode_reward/mean"


# ---------------------------------------------------------------------------------------
# Running


def train_command(
    config: str, mode: str, steps: int, run_dir: Path, extra: list[str]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "roll_async.cli",
        "train",
        config,
        *MODE_OVERRIDES[mode],
        f"max_steps={steps}",
        f"output_dir={run_dir}",
        "logging.progress_bar=false",
        *extra,
    ]


def run_mode(
    config: str, mode: str, steps: int, run_dir: Path, extra: list[str]
) -> float:
    """One ``roll-async train`` run in a subprocess; returns its wall seconds. Its log goes to run_dir/train.log."""
    return run_train(train_command(config, mode, steps, run_dir, extra), run_dir, mode)


# ---------------------------------------------------------------------------------------
# Reading and summarising


def read_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(per-step rows with step >= 0, the SFT warm-start row logged at step -1 or {})."""
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    sft = next((r for r in rows if r.get("step", 0) < 0), {})
    steps = sorted((r for r in rows if r.get("step", -1) >= 0), key=lambda r: r["step"])
    return steps, sft


def success_key(rows: list[dict[str, Any]]) -> str:
    keys = sorted(
        {k for r in rows for k in r if k.startswith("env/") and k.endswith("/success")}
    )
    if len(keys) != 1:
        raise SystemExit(
            f"expected one env/<tag>/success metric, found {keys}; the demo uses one env tag"
        )
    return keys[0]


def series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r.get(key, math.nan)) for r in rows]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    return [
        nan_mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))
    ]


def summarise(run_dir: Path, k: int, wall_s: float | None) -> dict[str, Any]:
    rows, sft = read_metrics(run_dir)
    skey = success_key(rows)
    tag = skey.split("/")[1]
    data = {
        "step": [int(r["step"]) for r in rows],
        "success": series(rows, skey),
        "reward": series(rows, REWARD_KEY),
        "action_is_valid": series(rows, f"env/{tag}/action_is_valid"),
        "staleness_max": series(rows, "rollout/staleness/max"),
        "step_total_s": series(rows, "time/step_total"),
    }
    n = len(rows)
    k = max(1, min(k, n // 2))
    first, last = slice(0, k), slice(n - k, n)
    summary = {
        "k": k,
        "steps": n,
        "success_first_k": nan_mean(data["success"][first]),
        "success_last_k": nan_mean(data["success"][last]),
        "reward_first_k": nan_mean(data["reward"][first]),
        "reward_last_k": nan_mean(data["reward"][last]),
        "valid_first_k": nan_mean(data["action_is_valid"][first]),
        "valid_last_k": nan_mean(data["action_is_valid"][last]),
        "success_max": max(data["success"]) if n else math.nan,
        "staleness_max": max(data["staleness_max"]) if n else math.nan,
        "train_loop_s": sum(v for v in data["step_total_s"] if not math.isnan(v)),
        "wall_s": wall_s,
    }
    summary["success_gain"] = summary["success_last_k"] - summary["success_first_k"]
    summary["reward_gain"] = summary["reward_last_k"] - summary["reward_first_k"]
    return {
        "run_dir": str(run_dir),
        "env_tag": tag,
        "sft": sft,
        "summary": summary,
        "series": data,
    }


def reference_policies(
    config_path: str, overrides: list[str], num_seeds: int = 1000
) -> dict[str, Any]:
    """Success of simple policies on the demo's env (pure env simulation, no model), to read the curves against.

    ``uniform_random``: a valid action drawn uniformly every turn. For FrozenLake
    also ``best_blind_sequence``: the best fixed order of the shortest path's
    Down/Right moves, played without looking at the map (the ceiling of a
    policy that never reads the holes).
    """
    import itertools
    import random

    from roll_async.config.schema import load_config
    from roll_async.envs import make_env

    config = load_config(REPO / config_path, overrides)
    tag = config.train_env_manager.tags[0]
    spec = config.custom_envs[tag]
    env = make_env(spec.env_type, dict(spec.env_config))
    wrap = env.parser.wrap
    seeds = range(10_000_000, 10_000_000 + num_seeds)  # not the training seeds

    def play(policy) -> float:
        wins = 0
        for seed in seeds:
            env.reset(seed=seed)
            for turn in range(spec.max_steps):
                _, _, terminated, truncated, _ = env.step(wrap(policy(turn)))
                if terminated or truncated:
                    break
            wins += bool(env.success)
        return wins / num_seeds

    rng = random.Random(0)
    words = list(env.action_words)
    out: dict[str, Any] = {"num_seeds": num_seeds, "max_steps": spec.max_steps}
    if words:
        out["uniform_random"] = play(lambda turn: rng.choice(words))
    if spec.env_type == "frozen_lake":
        n = int(getattr(env.config, "size", 4))
        orders = sorted(
            set(itertools.permutations(["Down"] * (n - 1) + ["Right"] * (n - 1)))
        )
        scored = [
            (play(lambda turn, o=o: o[turn] if turn < len(o) else "Down"), " ".join(o))
            for o in orders
        ]
        best = max(scored)
        out["best_blind_sequence"] = best[0]
        out["best_blind_sequence_moves"] = best[1]
    out["expert"] = 1.0  # the solver's plan, by construction
    return out


# ---------------------------------------------------------------------------------------
# Recording


def plot(
    results: dict[str, dict[str, Any]], window: int, path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"sync": "tab:blue", "async": "tab:orange"}
    panels = [
        ("success", "success rate (train rollouts)"),
        ("reward", "mean episode reward"),
        ("action_is_valid", "valid-action rate"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0))
    for ax, (key, label) in zip(axes, panels):
        for mode, res in results.items():
            xs, ys = res["series"]["step"], res["series"][key]
            color = colors.get(mode)
            ax.plot(xs, ys, color=color, alpha=0.25, linewidth=1)
            ax.plot(
                xs,
                smooth(ys, window),
                color=color,
                linewidth=2,
                label=f"{mode} ({window}-step mean)",
            )
        ax.set_xlabel("training step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[2].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(payload: dict[str, Any], png_name: str | None) -> str:
    results = payload["results"]
    k = next(iter(results.values()))["summary"]["k"]
    modes = ", ".join("`" + " ".join(v) + "`" for v in MODE_OVERRIDES.values())
    lines = [
        "# Learning demo: SFT warm start on partial expert demos, then GRPO (sync and async)",
        "",
        f"Recorded {payload['recorded_at']} on {payload['machine']['cpu_model']} "
        f"({payload['machine']['cpu_count']} CPUs, no GPU), vLLM {payload['machine'].get('vllm')}, "
        f"torch {payload['machine'].get('torch')}.",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Config: `{payload['config']}` + overrides {payload['overrides'] or '(none)'}; "
        f"{payload['steps']} GRPO steps per mode. Per mode: {modes}.",
        "",
        f"Each step trains on one rollout batch; success and reward are over that batch's episodes "
        f"(sampled at temperature 1). First/last {k} steps:",
        "",
        "| mode | success first | success last | reward first | reward last | valid first | valid last | max staleness | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, res in results.items():
        s = res["summary"]
        wall = f"{s['wall_s'] / 60:.1f} min" if s.get("wall_s") else "n/a"
        lines.append(
            f"| {mode} | {s['success_first_k']:.3f} | **{s['success_last_k']:.3f}** | {s['reward_first_k']:.3f} | "
            f"**{s['reward_last_k']:.3f}** | {s['valid_first_k']:.3f} | {s['valid_last_k']:.3f} | "
            f"{s['staleness_max']:.0f} | {wall} |"
        )
    sft = next(iter(results.values()))["sft"]
    if sft:
        lines += [
            "",
            f"SFT warm start (same in both modes): {sft.get('sft/examples', 0):.0f} partial demos, "
            f"{sft.get('sft/steps', 0):.0f} steps, loss {sft.get('sft/loss/first', math.nan):.2f} → "
            f"{sft.get('sft/loss/last', math.nan):.3f}; the kept demo turns alone solve "
            f"{sft.get('sft/demo_success_rate', 0):.0%} of the demo episodes.",
        ]
    ref = payload.get("reference_policies") or {}
    if ref:
        parts = (
            [f"uniform random valid actions {ref['uniform_random']:.3f}"]
            if "uniform_random" in ref
            else []
        )
        if "best_blind_sequence" in ref:
            parts.append(
                f"the best fixed move order played without reading the map ({ref['best_blind_sequence_moves']}) "
                f"{ref['best_blind_sequence']:.3f}"
            )
        parts.append("the expert 1.0")
        lines += [
            "",
            f"Reference success rates on {ref['num_seeds']} other seeds, {ref['max_steps']} turns: "
            + "; ".join(parts)
            + ".",
        ]
    if png_name:
        lines += ["", f"![learning curves]({png_name})"]
    lines += [""]
    return "\n".join(lines)


def claim_results(args: argparse.Namespace) -> ResultFiles:
    """The files this run writes; exits with one line if one exists and ``--overwrite`` was not given."""
    suffixes = [".json", ".md"] + ([] if args.no_plots else [".png"])
    return ResultFiles.claim(args.name, suffixes, overwrite=args.overwrite)


def record(
    out: ResultFiles, results: dict[str, dict[str, Any]], args: argparse.Namespace
) -> dict[str, Path]:
    window = args.smooth
    png = None
    if not args.no_plots:
        png = out.path(".png")
        tag = next(iter(results.values()))["env_tag"]
        plot(
            results,
            window,
            png,
            f"{tag}: tiny model, SFT warm start then GRPO ({args.steps} steps)",
        )
    payload = {
        "config": args.config,
        "overrides": args.set,
        "steps": args.steps,
        "smooth_window": window,
        "mode_overrides": MODE_OVERRIDES,
        "results": results,
        "reference_policies": reference_policies(args.config, list(args.set)),
    }
    json_path = out.write_json(payload)
    payload = json.loads(json_path.read_text())  # with recorded_at, command, machine
    md_path = out.write_text(".md", markdown(payload, png.name if png else None))
    written = {"json": json_path, "md": md_path}
    if png is not None:
        written["png"] = png
    return written


# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help="training config (default: %(default)s)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="GRPO steps per mode (default: 60, --quick: 25)",
    )
    p.add_argument(
        "--modes", nargs="+", default=["sync", "async"], choices=list(MODE_OVERRIDES)
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for every run",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short run, recorded as learning_demo_quick.*",
    )
    add_output_args(p, name_default=None, plots=True)
    p.add_argument(
        "--runs-dir",
        default=None,
        help="where the run directories go (default: a temp dir)",
    )
    p.add_argument(
        "--k",
        type=int,
        default=10,
        help="first/last k steps compared (default: %(default)s)",
    )
    p.add_argument(
        "--smooth",
        type=int,
        default=10,
        help="moving-average window of the plot (default: %(default)s)",
    )
    p.add_argument(
        "--from-runs",
        nargs="*",
        default=None,
        metavar="MODE=RUN_DIR",
        help="skip training: record from existing run directories",
    )
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 25 if args.quick else 60
    if args.name is None:
        args.name = "learning_demo_quick" if args.quick else "learning_demo"
    if args.quick:
        args.k = min(args.k, 5)
        args.smooth = min(args.smooth, 5)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = claim_results(args)
    results: dict[str, dict[str, Any]] = {}
    if args.from_runs is not None:
        for item in args.from_runs:
            mode, _, run_dir = item.partition("=")
            results[mode] = summarise(Path(run_dir), args.k, None)
        args.steps = max(r["summary"]["steps"] for r in results.values())
    else:
        runs_dir = Path(
            args.runs_dir or tempfile.mkdtemp(prefix="roll_async_learning_demo_")
        )
        for mode in args.modes:
            run_dir = runs_dir / mode
            wall = run_mode(args.config, mode, args.steps, run_dir, list(args.set))
            results[mode] = summarise(run_dir, args.k, wall)
    paths = record(out, results, args)
    for mode, res in results.items():
        s = res["summary"]
        print(
            f"{mode}: success {s['success_first_k']:.3f} -> {s['success_last_k']:.3f} | reward "
            f"{s['reward_first_k']:.3f} -> {s['reward_last_k']:.3f} (first/last {s['k']} steps) | run {res['run_dir']}"
        )
    print("recorded: " + ", ".join(str(p.relative_to(REPO)) for p in paths.values()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
