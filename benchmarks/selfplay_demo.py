"""The self-play demo on several seeds: win rate against the random player before and after training, on CPU.

``configs/selfplay.yaml`` trains the offline tiny model by self-play on Nim (a pile of 5-15
stones, take 1-3, the last stone wins) after a brief SFT warm start on the random player's
games (the answer format, no strategy). Its validation plays the same seeded games against
the random player (half moving first, half second, greedy) once before the first RL step (``eval_at_start``, after the warm start) and
once at the end, so start and end are measured on the same games and any rise is RL's.
This script runs the config once per run seed as a ``roll-async train`` subprocess, reads
each run's ``metrics.jsonl`` and records start and end win rates (median and spread over
the seeds) in ``benchmarks/results/<name>.{json,md}`` with the command, the machine, its
load average and, for scale, the scripted players' win rates against the random player
(played here, 2,000 games per seat). A run that does not learn is recorded as it is.

    python -m benchmarks.selfplay_demo                    # seeds 1 2 3
    python -m benchmarks.selfplay_demo --seeds 1 2 3 4 5 --steps 20 --name selfplay_demo_cpu_long
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

from benchmarks.common import (
    ResultFiles,
    add_output_args,
    command_line,
    machine_info,
    run_train,
    spread,
)
from roll_async.envs.multiplayer import HEURISTICS, make_game, play_match, random_player
from roll_async.envs.multiplayer.players import Player

CONFIG = "configs/selfplay.yaml"
#: The validation tags of the config: the policy moving first (seat 0) and second (seat 1) against the random player.
VAL_TAGS = ("ValFirst", "ValSecond")
#: The game the config's tags play, and the scripted games per seat behind the for-scale line.
GAME = "nim"
SCALE_GAMES = 2000
#: Per-seed numbers read from a run: validation win/loss/draw/invalid-move rates at the start and the end.
RATES = ("game_win", "game_loss", "game_draw", "game_invalid_move")


def train_command(
    seed: int, steps: int | None, run_dir: Path, extra: list[str]
) -> list[str]:
    steps_override = [f"max_steps={steps}", f"eval_steps={steps}"] if steps else []
    return [
        sys.executable,
        "-m",
        "roll_async.cli",
        "train",
        CONFIG,
        f"seed={seed}",
        *steps_override,
        f"output_dir={run_dir}",
        "logging.progress_bar=false",
        *extra,
    ]


def validation_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics rows that carry validation results, in step order."""
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return sorted(
        (r for r in rows if "val/num_episodes" in r), key=lambda r: int(r["step"])
    )


def summarise_run(run_dir: Path) -> dict[str, Any]:
    """Start (before step 0) and end (after the last step) validation rates of one run, per val tag and overall."""
    rows = validation_rows(run_dir)
    if len(rows) < 2 or int(rows[0]["step"]) >= 0:
        raise SystemExit(
            f"{run_dir}/metrics.jsonl has no start and end validation (eval_at_start: true and eval_steps "
            "dividing max_steps in the config); got validation at steps "
            f"{[int(r['step']) for r in rows]}"
        )
    out: dict[str, Any] = {"run_dir": str(run_dir)}
    for when, row in (("start", rows[0]), ("end", rows[-1])):
        per_tag = {
            tag: {rate: float(row[f"val/{tag}/{rate}"]) for rate in RATES}
            for tag in VAL_TAGS
        }
        out[when] = {
            "step": int(row["step"]),
            "per_tag": per_tag,
            "win_rate": sum(per_tag[t]["game_win"] for t in VAL_TAGS) / len(VAL_TAGS),
            "episodes": float(row["val/num_episodes"]),
        }
    sft = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip() and '"sft/loss/last"' in line
    ]
    out["sft_loss_last"] = float(sft[0]["sft/loss/last"]) if sft else None
    return out


def scripted_win_rates(games: int = SCALE_GAMES) -> dict[str, list[float]]:
    """Win rates against the random player of the random and the heuristic player, per seat, over ``games`` seeds."""
    game = make_game(GAME)
    out: dict[str, list[float]] = {}
    for name in ("random", "heuristic"):
        rates = []
        for seat in (0, 1):
            wins = 0
            for seed in range(games):
                players = [random_player(seed * 2 + s + 10_000) for s in (0, 1)]
                mine: Player = (
                    HEURISTICS[GAME]
                    if name == "heuristic"
                    else random_player(seed + 777)
                )
                players[seat] = mine
                wins += play_match(game, players, seed).rewards[seat] > 0
            rates.append(wins / games)
        out[name] = rates
    return out


def markdown(payload: dict[str, Any]) -> str:
    runs = payload["runs"]
    games = int(next(iter(runs.values()))["start"]["episodes"]) if runs else 0
    lines = [
        "# Self-play demo (Nim, tiny model, CPU): win rate against the random player",
        "",
        f"Recorded {payload['recorded_at']} on {payload['machine']['cpu_model']} "
        f"({payload['machine']['cpu_count']} CPUs, no GPU), load average before/after "
        f"{payload['load_average']['before']} / {payload['load_average']['after']} (a shared machine).",
        "",
        f"Command: `{payload['command']}`",
        "",
        f"Validation: the same {games} seeded games ({games // 2} moving first, {games // 2} second; greedy) before "
        "the first RL step (after the SFT warm start) and after the last; win rate = mean over the two.",
        "",
        "| seed | win rate start | win rate end | first start → end | second start → end | invalid-move rate start → end | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, run in runs.items():
        s, e = run["start"], run["end"]
        x = tuple(r["per_tag"][VAL_TAGS[0]]["game_win"] for r in (s, e))
        o = tuple(r["per_tag"][VAL_TAGS[1]]["game_win"] for r in (s, e))
        inv = [
            sum(r["per_tag"][t]["game_invalid_move"] for t in VAL_TAGS) / 2
            for r in (s, e)
        ]
        wall = "n/a" if math.isnan(run["wall_s"]) else f"{run['wall_s'] / 60:.1f} min"
        lines.append(
            f"| {seed} | {s['win_rate']:.3f} | {e['win_rate']:.3f} | {x[0]:.3f} → {x[1]:.3f} | "
            f"{o[0]:.3f} → {o[1]:.3f} | {inv[0]:.3f} → {inv[1]:.3f} | {wall} |"
        )
    start, end = (
        payload["summary"]["start_win_rate"],
        payload["summary"]["end_win_rate"],
    )
    scale = payload["scripted_win_rates"]
    lines += [
        "",
        f"Median over {start['n']} seeds: start {start['median']:.3f} (min {start['min']:.3f}, max "
        f"{start['max']:.3f}), end {end['median']:.3f} (min {end['min']:.3f}, max {end['max']:.3f}); "
        f"the end beats the start on {payload['summary']['seeds_improved']} of {start['n']} seeds.",
        "",
        f"For scale ({scale['games']:,} games per seat of scripted players): the random player wins "
        f"{scale['random'][0]:.2f} moving first and {scale['random'][1]:.2f} second against the random "
        f"player; the heuristic player (leave a multiple of 4) wins {scale['heuristic'][0]:.2f} and "
        f"{scale['heuristic'][1]:.2f}.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="run seeds")
    p.add_argument(
        "--steps", type=int, default=None, help="RL steps (default: the config's)"
    )
    p.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides"
    )
    p.add_argument(
        "--runs-dir",
        default=None,
        help="keep the run directories here (default: a temp dir)",
    )
    p.add_argument(
        "--from-runs",
        nargs="*",
        default=None,
        metavar="SEED=DIR",
        help="record from existing run directories without training",
    )
    add_output_args(p, name_default="selfplay_demo_cpu")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    load_before = os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}
    if args.from_runs is not None:
        for item in args.from_runs:
            seed, _, path = item.partition("=")
            runs[seed] = {**summarise_run(Path(path)), "wall_s": float("nan")}
    else:
        base = Path(args.runs_dir or tempfile.mkdtemp(prefix="selfplay_demo_"))
        for seed in args.seeds:
            run_dir = base / f"seed{seed}"
            wall = run_train(
                train_command(seed, args.steps, run_dir, list(args.set)),
                run_dir,
                f"seed {seed}",
            )
            runs[str(seed)] = {**summarise_run(run_dir), "wall_s": wall}
            print(
                f"[seed {seed}] win rate vs random: {runs[str(seed)]['start']['win_rate']:.3f} -> "
                f"{runs[str(seed)]['end']['win_rate']:.3f} ({wall / 60:.1f} min)",
                flush=True,
            )
    starts = [r["start"]["win_rate"] for r in runs.values()]
    ends = [r["end"]["win_rate"] for r in runs.values()]
    payload: dict[str, Any] = {
        "config": CONFIG,
        "command": command_line(),
        "machine": machine_info(),
        "load_average": {
            "before": [round(v, 1) for v in load_before],
            "after": [round(v, 1) for v in os.getloadavg()],
        },
        "runs": runs,
        "scripted_win_rates": {"games": SCALE_GAMES, **scripted_win_rates()},
        "summary": {
            "start_win_rate": spread(starts),
            "end_win_rate": spread(ends),
            "seeds_improved": sum(e > s for s, e in zip(starts, ends)),
        },
    }
    path = out.write_json(payload)
    payload = json.loads(path.read_text())  # with recorded_at
    out.write_text(".md", markdown(payload))
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
