"""PNG figures of the env grouping benchmark and the scale simulation (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEDULER_COLORS = {
    "per_env": "#1f77b4",
    "per_env_sync": "#7fb3e0",
    "barrier": "#d62728",
}

#: (CSV column, panel title) of the overview figure.
PANELS = [
    ("trajectories_per_s", "trajectories / s"),
    ("tokens_per_s", "generated tokens / s (ceiling: black tick)"),
    ("tokens_vs_ceiling", "tokens/s ÷ engine ceiling (same N, lengths)"),
    ("engine_busy_fraction", "engine busy fraction"),
    ("get_batch_wait_mean_s", "get_batch wait per batch (s)"),
    ("episode_latency_p50_s", "episode latency p50 (s)"),
    ("episode_latency_p99_s", "episode latency p99 (s)"),
    ("tail10_share", "share of wall time on slowest 10% of episodes"),
]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _num(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


def point_label(row: dict[str, Any]) -> str:
    return f"{row['workload']}\n{row['num_env_groups']}x{row['group_size']} W{row['max_env_num_per_worker']}"


def plot_overview(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """One panel per figure; x: (workload, grid point), bars: schedulers."""
    plt = _plt()
    labels: list[str] = []
    for row in rows:
        label = point_label(row)
        if label not in labels:
            labels.append(label)
    schedulers = [s for s in SCHEDULER_COLORS if any(r["scheduler"] == s for r in rows)]
    schedulers += sorted({r["scheduler"] for r in rows} - set(schedulers))
    width = 0.8 / max(1, len(schedulers))
    fig, axes = plt.subplots(4, 2, figsize=(max(12, 1.6 * len(labels) + 4), 16))
    for ax, (column, panel_title) in zip(axes.flat, PANELS):
        for k, scheduler in enumerate(schedulers):
            xs, ys = [], []
            for i, label in enumerate(labels):
                match = [
                    r
                    for r in rows
                    if point_label(r) == label and r["scheduler"] == scheduler
                ]
                if match:
                    xs.append(i + (k - (len(schedulers) - 1) / 2) * width)
                    ys.append(_num(match[0].get(column)))
            ax.bar(
                xs,
                ys,
                width=width,
                label=scheduler,
                color=SCHEDULER_COLORS.get(scheduler),
            )
        if column == "tokens_per_s":
            for i, label in enumerate(labels):
                ceilings = [
                    _num(r.get("ceiling_tokens_per_s"))
                    for r in rows
                    if point_label(r) == label
                ]
                ceilings = [c for c in ceilings if not math.isnan(c)]
                if ceilings:
                    ax.hlines(
                        ceilings[0], i - 0.45, i + 0.45, colors="black", linewidth=2
                    )
        if column in ("tokens_vs_ceiling", "engine_busy_fraction", "tail10_share"):
            ax.axhline(
                1.0 if column != "tail10_share" else 0.0,
                color="grey",
                linewidth=0.8,
                linestyle="--",
            )
        ax.set_title(panel_title, fontsize=10)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Per workload with more than one grid point: per-env ÷ barrier speedup and trajectories/s per point."""
    plt = _plt()
    workloads = []
    for row in rows:
        if row["workload"] not in workloads:
            workloads.append(row["workload"])
    swept = [
        w
        for w in workloads
        if len({point_label(r) for r in rows if r["workload"] == w}) > 1
    ]
    if not swept:
        return None
    fig, axes = plt.subplots(len(swept), 2, figsize=(13, 4 * len(swept)), squeeze=False)
    for (ax_speed, ax_tput), workload in zip(axes, swept):
        wrows = [r for r in rows if r["workload"] == workload]
        labels: list[str] = []
        for r in wrows:
            label = point_label(r).split("\n", 1)[1]
            if label not in labels:
                labels.append(label)
        speedups = []
        for label in labels:
            per_env = [
                r
                for r in wrows
                if point_label(r).endswith(label) and r["scheduler"] == "per_env"
            ]
            speedups.append(
                _num(per_env[0].get("speedup_vs_barrier")) if per_env else math.nan
            )
        ax_speed.bar(range(len(labels)), speedups, color=SCHEDULER_COLORS["per_env"])
        ax_speed.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        for i, s in enumerate(speedups):
            if not math.isnan(s):
                ax_speed.text(i, s, f"{s:.2f}x", ha="center", va="bottom", fontsize=8)
        ax_speed.set_title(
            f"{workload}: per-env ÷ barrier (trajectories/s)", fontsize=10
        )
        ax_speed.set_xticks(range(len(labels)))
        ax_speed.set_xticklabels(labels, fontsize=8)
        for scheduler in [
            s for s in SCHEDULER_COLORS if any(r["scheduler"] == s for r in wrows)
        ]:
            ys = []
            for label in labels:
                match = [
                    r
                    for r in wrows
                    if point_label(r).endswith(label) and r["scheduler"] == scheduler
                ]
                ys.append(_num(match[0]["trajectories_per_s"]) if match else math.nan)
            ax_tput.plot(
                range(len(labels)),
                ys,
                marker="o",
                label=scheduler,
                color=SCHEDULER_COLORS[scheduler],
            )
        ax_tput.set_title(
            f"{workload}: trajectories/s per grid point (groups x size, W = envs per worker)",
            fontsize=10,
        )
        ax_tput.set_xticks(range(len(labels)))
        ax_tput.set_xticklabels(labels, fontsize=8)
        ax_tput.legend(fontsize=8)
        ax_tput.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_scale(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Scale simulation: scheduler CPU per trajectory and memory per env vs number of envs."""
    plt = _plt()
    envs = [r["num_envs"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(
        envs,
        [r["scheduler_cpu_us_per_trajectory"] for r in rows],
        marker="o",
        label="per trajectory",
    )
    axes[0].plot(
        envs,
        [r["scheduler_cpu_us_per_turn"] for r in rows],
        marker="s",
        label="per turn",
    )
    axes[0].set_title(
        "scheduler CPU (µs): rollout side minus simulator and env calls", fontsize=10
    )
    axes[1].plot(
        envs, [r["rss_kb_per_env_built"] for r in rows], marker="o", label="after build"
    )
    axes[1].plot(
        envs,
        [r["rss_kb_per_env_peak"] for r in rows],
        marker="s",
        label="peak while running",
    )
    axes[1].set_title("memory per env (KB, RSS delta / envs)", fontsize=10)
    axes[2].plot(
        envs,
        [r["tokens_vs_sim_ceiling"] for r in rows],
        marker="o",
        label="tokens/s ÷ simulated ceiling",
    )
    axes[2].plot(
        envs,
        [r["sim_engine_busy_fraction"] for r in rows],
        marker="s",
        label="sim engine busy fraction",
    )
    axes[2].set_title("simulated throughput vs the model's own ceiling", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("env instances")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
