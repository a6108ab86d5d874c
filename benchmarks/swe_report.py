"""The swe rollout benchmark's Markdown report, kept apart from the runs so each file has one role.

It says, in the order a reader asks: what ran (the command, machine, runtime, load), the headline
ratios against the barrier, each scheduler's throughput and workspace utilisation (median and range
of the paired runs), where the env slots' time went, and every run's own row.
"""

from __future__ import annotations

from typing import Any

_PHASES = ("start", "policy", "exec", "verifier", "close", "idle")


def _range(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    return (
        f"**{fmt.format(s['median'])}** ({fmt.format(s['min'])}–{fmt.format(s['max'])})"
    )


def to_markdown(payload: dict[str, Any]) -> str:
    settings = payload["settings"]
    summary = payload["summary"]
    machine = payload.get("machine", {})
    runs = payload["runs"]
    envs = settings["num_env_groups"] * settings["group_size"]
    loads = [r["load1_start"] for r in runs] + [r["load1_end"] for r in runs]
    lines = [
        f"# swe_rollout ({payload['runtime']} runtime)",
        "",
        f"Command: `{payload.get('command', '')}`  ",
        f"Recorded: {payload.get('recorded_at', '')}; machine: {machine.get('cpu_model', '?')}, "
        f"{machine.get('cpu_count', '?')} cores, {machine.get('memory_gib', '?')} GiB; "
        f"1-minute load average {min(loads):.1f}–{max(loads):.1f} during the runs (the machine is shared).  ",
        f"{envs} envs ({settings['num_env_groups']} groups × {settings['group_size']}), "
        f"{settings['num_batches']} batches of {envs} per run, {settings['repeats']} paired runs, "
        f"task format {settings['task_format']}, max {settings['max_turns']} turns; the policy is SCRIPTED "
        "(reference solution + seeded detours), its decode time SIMULATED from "
        f"`{settings['calibration'].split('/')[-1]}` at time scale {settings['time_scale']}.",
        "",
    ]
    for name, s in summary["vs_barrier"].items():
        lines.append(
            f"- {name} ÷ barrier: {_range(s, '{:.2f}')}× trajectories/s (median of {s['n']} paired runs)"
        )
    lines += [
        "",
        "| scheduler | trajectories/s | container busy | slot occupancy | turns | p50 latency s | success |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary["schedulers"].items():
        lines.append(
            f"| {name} | {_range(s['trajectories_per_s'])} | {_range(s['container_busy_fraction'], '{:.2f}')} | "
            f"{_range(s['slot_occupancy'], '{:.2f}')} | {s['turns_mean']['median']:.1f} | "
            f"{s['episode_latency_p50_s']['median']:.1f} | {s['success_rate']['median']:.2f} |"
        )
    lines += [
        "",
        "Where the env slots' time went (share of envs × wall, median of the runs; idle = waiting on the "
        "barrier or for a seat) and the mean seconds of one span:",
        "",
        "| scheduler | "
        + " | ".join(_PHASES)
        + " | start s | exec s | verifier s | close s | policy s / turn |",
        "|---|" + "---|" * (len(_PHASES) + 5),
    ]
    for name, s in summary["schedulers"].items():
        shares = " | ".join(f"{s['slot_share'][p]:.2f}" for p in _PHASES)
        m = s["mean_s"]
        lines.append(
            f"| {name} | {shares} | {m['start']:.2f} | {m['exec']:.2f} | {m['verifier']:.2f} | "
            f"{m['close']:.2f} | {m['policy_per_turn']:.2f} |"
        )
    lines += [
        "",
        "Every run:",
        "",
        "| scheduler | repeat | trajectories | wall s | trajectories/s | busy | occupancy | pool hits | errors | load1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['scheduler']} | {r['repeat']} | {r['trajectories']} | {r['wall_s']:.1f} | "
            f"{r['trajectories_per_s']:.3f} | {r['container_busy_fraction']:.2f} | {r['slot_occupancy']:.2f} | "
            f"{r['pool_hits']}/{r['workspace_starts']} | {r['errors']} | {r['load1_start']}→{r['load1_end']} |"
        )
    lines += [
        "",
        "Definitions: *container busy* = seconds of agent commands and hidden tests ÷ seconds the workspaces "
        "existed; *slot occupancy* = seconds workspaces existed ÷ (envs × wall). Per-env runs are timed from "
        "the first `get_batch` to the last one's return (work for later batches is not counted); the barrier "
        "from the first reset to the end of the last round.",
        "",
    ]
    return "\n".join(lines)
