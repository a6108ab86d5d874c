"""Does a bfloat16 mixed-precision run learn the main job's task as a float32 run does?

The main job (``scripts/main.sh``: ``roll-async train configs/default.yaml``) is run twice per seed
through the real CLI (vLLM engine, Ray env workers, trainer), once with ``trainer.param_dtype=float32``
and once with ``trainer.param_dtype=bfloat16`` (``torch.autocast`` bf16 compute, float32 master
weights and AdamW state); the seed (``seed=S``) and every other key are the same in both. The runs
alternate (seed 1: fp32 then bf16, seed 2: bf16 then fp32, ...) so that load from other jobs on the
machine falls on both precisions alike. Each run's ``metrics.jsonl`` is read back and recorded in
``benchmarks/results/<name>.{json,md[,png]}``: per step the train success (the batch's episodes,
sampled at temperature 1) per precision as the median over seeds, per run the final, best and
first/last-k success, the validation success (greedy, at ``eval_steps``), the importance ratio and
gradient norm (where bf16 would first show trouble) and the wall time.

    python -m benchmarks.precision_curve                       # 2 seeds, 4 runs: precision_curve.*
    python -m benchmarks.precision_curve --seeds 3 --steps 30 --name precision_curve_3x30
    python -m benchmarks.precision_curve --from-runs RUNS_DIR   # re-record from <RUNS_DIR>/<dtype>_seed<S>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, ResultFiles, add_output_args, nan_mean, run_train

DEFAULT_CONFIG = "configs/default.yaml"
DTYPES = ("float32", "bfloat16")
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
REWARD_KEY = "rollout/episode_reward/mean"
RATIO_KEY = "train/importance_ratio/mean"
GRAD_NORM_KEY = "train/grad_norm"


# ---------------------------------------------------------------------------------------
# Running


def run_order(seeds: list[int]) -> list[tuple[int, str]]:
    """(seed, dtype) in run order: fp32 first for the 1st seed, bf16 first for the 2nd, and so on."""
    order: list[tuple[int, str]] = []
    for i, seed in enumerate(seeds):
        dtypes = DTYPES if i % 2 == 0 else DTYPES[::-1]
        order += [(seed, d) for d in dtypes]
    return order


def run_dir_name(dtype: str, seed: int) -> str:
    return f"{SHORT[dtype]}_seed{seed}"


def train_command(
    config: str,
    dtype: str,
    seed: int,
    steps: int | None,
    run_dir: Path,
    extra: list[str],
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "roll_async.cli",
        "train",
        config,
        f"trainer.param_dtype={dtype}",
        f"seed={seed}",
        *([f"max_steps={steps}"] if steps else []),
        f"output_dir={run_dir}",
        "logging.progress_bar=false",
        *extra,
    ]


def run_one(
    config: str,
    dtype: str,
    seed: int,
    steps: int | None,
    run_dir: Path,
    extra: list[str],
) -> float:
    """One ``roll-async train`` run in a subprocess; returns its wall seconds. Its log goes to run_dir/train.log."""
    cmd = train_command(config, dtype, seed, steps, run_dir, extra)
    wall = run_train(cmd, run_dir, run_dir_name(dtype, seed))
    (run_dir / "wall_s.txt").write_text(f"{wall:.1f}\n")
    return wall


# ---------------------------------------------------------------------------------------
# Reading and summarising


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics rows (one per logged step, the SFT warm start's at step -1 included)."""
    return [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


def _only_key(rows: list[dict[str, Any]], prefix: str, suffix: str) -> str | None:
    keys = sorted(
        {
            k
            for r in rows
            for k in r
            if k.startswith(prefix) and k.endswith(suffix) and k.count("/") == 2
        }
    )
    if len(keys) > 1:
        raise SystemExit(f"expected one {prefix}<tag>{suffix} metric, found {keys}")
    return keys[0] if keys else None


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def summarise_run(run_dir: Path, k: int, wall_s: float | None) -> dict[str, Any]:
    """One run's curves (train steps >= 0, validation at the steps it ran) and their summary."""
    rows = read_rows(run_dir)
    train = sorted(
        (
            r
            for r in rows
            if r.get("step", -1) >= 0 and any(k.startswith("train/") for k in r)
        ),
        key=lambda r: r["step"],
    )
    skey = _only_key(train, "env/", "/success")
    if skey is None:
        raise SystemExit(f"{run_dir}: no env/<tag>/success metric in metrics.jsonl")
    vkey = _only_key(rows, "val/", "/success")
    curve = {
        "step": [int(r["step"]) for r in train],
        "success": [_num(r.get(skey)) for r in train],
        "reward": [_num(r.get(REWARD_KEY)) for r in train],
        "importance_ratio_mean": [_num(r.get(RATIO_KEY)) for r in train],
        "grad_norm": [_num(r.get(GRAD_NORM_KEY)) for r in train],
    }
    val = (
        {
            str(int(r["step"])): float(r[vkey])
            for r in sorted(rows, key=lambda r: r.get("step", -1))
            if vkey in r
        }
        if vkey
        else {}
    )
    n = len(train)
    k = max(1, min(k, n // 2)) if n else 1
    success = curve["success"]
    ratios = [v for v in curve["importance_ratio_mean"] if not math.isnan(v)]
    norms = [v for v in curve["grad_norm"] if not math.isnan(v)]
    summary = {
        "steps": n,
        "k": k,
        "success_first_k": nan_mean(success[:k]),
        "success_last_k": nan_mean(success[n - k :]),
        "success_final": success[-1] if n else math.nan,
        "success_best": max(success) if n else math.nan,
        "val_success": val,
        "val_success_final": val[max(val, key=int)] if val else math.nan,
        "importance_ratio_mean_range": [min(ratios), max(ratios)] if ratios else None,
        "grad_norm_median": statistics.median(norms) if norms else math.nan,
        "grad_norm_max": max(norms) if norms else math.nan,
        "train_loop_s": sum(
            _num(r.get("time/step_total"))
            for r in train
            if not math.isnan(_num(r.get("time/step_total")))
        ),
        "wall_s": wall_s,
    }
    return {
        "run_dir": str(run_dir),
        "success_key": skey,
        "val_key": vkey,
        "summary": summary,
        "curve": curve,
    }


def median_curves(
    runs: dict[str, dict[str, Any]], seeds: list[int]
) -> dict[str, dict[str, list[float]]]:
    """Per dtype: the steps and, per step, the median over seeds of success and reward."""
    out: dict[str, dict[str, list[float]]] = {}
    for dtype in DTYPES:
        per_seed = [runs[run_dir_name(dtype, s)]["curve"] for s in seeds]
        steps = sorted(set().union(*(c["step"] for c in per_seed)))
        entry: dict[str, list[float]] = {"step": steps}
        for key in ("success", "reward"):
            values = []
            for step in steps:
                at = [
                    c[key][c["step"].index(step)]
                    for c in per_seed
                    if step in c["step"]
                    and not math.isnan(c[key][c["step"].index(step)])
                ]
                values.append(statistics.median(at) if at else math.nan)
            entry[key] = values
        out[dtype] = entry
    return out


def comparison(
    runs: dict[str, dict[str, Any]], seeds: list[int]
) -> dict[str, dict[str, float]]:
    """Per dtype, medians over seeds of the per-run summary figures."""
    out: dict[str, dict[str, float]] = {}
    for dtype in DTYPES:
        summaries = [runs[run_dir_name(dtype, s)]["summary"] for s in seeds]
        out[dtype] = {
            key: statistics.median(s[key] for s in summaries)
            for key in (
                "success_first_k",
                "success_last_k",
                "success_final",
                "success_best",
                "val_success_final",
                "grad_norm_median",
                "wall_s",
            )
            if all(s.get(key) is not None and not math.isnan(s[key]) for s in summaries)
        }
    return out


# ---------------------------------------------------------------------------------------
# Recording


def _f(value: Any, fmt: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def markdown(payload: dict[str, Any], png_name: str | None) -> str:
    seeds = payload["seeds"]
    runs = payload["runs"]
    curves = payload["median_curves"]
    cmp_ = payload["comparison"]
    k = next(iter(runs.values()))["summary"]["k"]
    m = payload["machine"]
    lines = [
        "# bf16 mixed precision vs fp32: the main job's learning curve",
        "",
        f"Recorded {payload['recorded_at']} on {m.get('cpu_model')} ({m.get('cpu_count')} CPUs, no GPU), "
        f"torch {m.get('torch')}, vLLM {m.get('vllm')}.",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Config: `{payload['config']}` + overrides {payload['overrides'] or '(none)'}; per run "
        "`trainer.param_dtype=float32` or `trainer.param_dtype=bfloat16` (bf16 autocast compute, "
        f"fp32 master weights and AdamW state) and `seed=S` for S in {seeds}; everything else identical. "
        f"Run order (alternating): {', '.join(payload['run_order'])}.",
        "",
        "## Summary (median over seeds)",
        "",
        f"| precision | success first {k} | success last {k} | final success | best success | val success (last eval) | grad norm (median) | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dtype in DTYPES:
        c = cmp_[dtype]
        wall = f"{c['wall_s'] / 60:.1f} min" if "wall_s" in c else "n/a"
        lines.append(
            f"| {dtype} | {_f(c.get('success_first_k'))} | **{_f(c.get('success_last_k'))}** | "
            f"{_f(c.get('success_final'))} | {_f(c.get('success_best'))} | "
            f"{_f(c.get('val_success_final'))} | {_f(c.get('grad_norm_median'), '.2f')} | {wall} |"
        )
    lines += [
        "",
        "## Per run",
        "",
        f"| run | success first {k} | success last {k} | final | best | val success by step | importance ratio (min-max of step means) | grad norm median / max | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label in payload["run_order"]:
        s = runs[label]["summary"]
        val = (
            ", ".join(f"{step}: {v:.3f}" for step, v in s["val_success"].items())
            or "n/a"
        )
        ratio = s["importance_ratio_mean_range"]
        ratio_s = f"{ratio[0]:.4f}-{ratio[1]:.4f}" if ratio else "n/a"
        wall = f"{s['wall_s']:.0f} s" if s.get("wall_s") else "n/a"
        lines.append(
            f"| {label} | {_f(s['success_first_k'])} | {_f(s['success_last_k'])} | {_f(s['success_final'])} | "
            f"{_f(s['success_best'])} | {val} | {ratio_s} | {_f(s['grad_norm_median'], '.2f')} / "
            f"{_f(s['grad_norm_max'], '.2f')} | {wall} |"
        )
    lines += [
        "",
        "## Train success per step (median over seeds)",
        "",
        "Success of the step's rollout batch (64 episodes sampled at temperature 1); reward likewise.",
        "",
        "| step | fp32 success | bf16 success | fp32 reward | bf16 reward |",
        "|---:|---:|---:|---:|---:|",
    ]
    fp, bf = curves["float32"], curves["bfloat16"]
    for i, step in enumerate(fp["step"]):
        j = bf["step"].index(step) if step in bf["step"] else None
        lines.append(
            f"| {step} | {_f(fp['success'][i])} | {_f(bf['success'][j] if j is not None else None)} | "
            f"{_f(fp['reward'][i])} | {_f(bf['reward'][j] if j is not None else None)} |"
        )
    if png_name:
        lines += ["", f"![success curves]({png_name})"]
    lines += [""]
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"float32": "tab:blue", "bfloat16": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, run in payload["runs"].items():
        dtype = "float32" if label.startswith("fp32") else "bfloat16"
        c = run["curve"]
        axes[0].plot(
            c["step"], c["success"], color=colors[dtype], alpha=0.3, linewidth=1
        )
        axes[1].plot(
            c["step"], c["grad_norm"], color=colors[dtype], alpha=0.6, linewidth=1
        )
    for dtype, c in payload["median_curves"].items():
        axes[0].plot(
            c["step"],
            c["success"],
            color=colors[dtype],
            linewidth=2,
            label=f"{dtype} (median)",
        )
    axes[0].set_title("train success (thin: each seed)")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(loc="upper left")
    axes[1].set_title("grad norm (each run)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


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
        "--seeds",
        type=int,
        default=2,
        help="seeds, each run in both precisions (default: %(default)s)",
    )
    p.add_argument(
        "--first-seed",
        type=int,
        default=42,
        help="seeds are this, +1, ... (default: %(default)s, the config's)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="max_steps per run (default: the config's)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for every run",
    )
    p.add_argument(
        "--runs-dir",
        default=None,
        help="where the run directories go (default: a temp dir)",
    )
    p.add_argument(
        "--from-runs",
        default=None,
        metavar="RUNS_DIR",
        help="skip training: record from RUNS_DIR/<fp32|bf16>_seed<S>",
    )
    p.add_argument(
        "--k",
        type=int,
        default=5,
        help="first/last k steps compared (default: %(default)s)",
    )
    add_output_args(p, name_default="precision_curve", plots=True)
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plots = not args.no_plots and _have_matplotlib()
    out = ResultFiles.claim(
        args.name,
        [".json", ".md"] + ([".png"] if plots else []),
        overwrite=args.overwrite,
    )
    seeds = [args.first_seed + i for i in range(args.seeds)]
    order = run_order(seeds)
    runs_dir = Path(
        args.from_runs
        or args.runs_dir
        or tempfile.mkdtemp(prefix="roll_async_precision_")
    )
    runs: dict[str, dict[str, Any]] = {}
    for seed, dtype in order:
        run_dir = runs_dir / run_dir_name(dtype, seed)
        if args.from_runs:
            wall_file = run_dir / "wall_s.txt"
            wall = float(wall_file.read_text()) if wall_file.exists() else None
        else:
            wall = run_one(
                args.config, dtype, seed, args.steps, run_dir, list(args.set)
            )
        runs[run_dir_name(dtype, seed)] = summarise_run(run_dir, args.k, wall)
    payload: dict[str, Any] = {
        "config": args.config,
        "overrides": args.set,
        "steps": args.steps,
        "seeds": seeds,
        "run_order": [run_dir_name(d, s) for s, d in order],
        "runs": runs,
        "median_curves": median_curves(runs, seeds),
        "comparison": comparison(runs, seeds),
    }
    json_path = out.write_json(payload)
    payload = json.loads(json_path.read_text())  # with recorded_at, command, machine
    written = [json_path]
    png_name = None
    if plots:
        plot(payload, out.path(".png"))
        png_name = out.path(".png").name
        written.append(out.path(".png"))
    written.append(out.write_text(".md", markdown(payload, png_name)))
    for dtype, c in payload["comparison"].items():
        print(
            f"{dtype}: success first/last {args.k} {_f(c.get('success_first_k'))} -> "
            f"{_f(c.get('success_last_k'))}, best {_f(c.get('success_best'))}, "
            f"val {_f(c.get('val_success_final'))} (medians over seeds {seeds})"
        )
    print(f"runs: {runs_dir}")
    print("recorded: " + ", ".join(str(p.relative_to(REPO)) for p in written))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
