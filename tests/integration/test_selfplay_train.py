"""Games with seats train end to end on the session's real CPU engine, every game of the slow tier in one run.

One run trains the games of :data:`GAMES` side by side (each a tag of its own: the config's Kuhn poker
and Nim, the project's offline tic-tac-toe and a real TextArena two-player game,
``textarena:TicTacToe-v0``, offline) for 3 steps in self-play in sync mode, and a second run for 3 steps in async mode (``frozen:``
and ``snapshot:`` seats of a LoRA run train in test_lora.py, whose LoRA engine serves them; a full-weight
run's ``snapshot:1`` seat, on the engine the pipeline launches for it, trains here). The tiny random-init
model rarely writes a legal move, so the checks are what every step must show: whole batches of one
trajectory per policy seat and game, each role in every group, rewards that sum to 0 per game, each
game's tag in the batches, a finite loss and weight versions rising by one.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from tests.integration.short_runs import IN_PROCESS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: The games trained together: tag -> the overrides that define it (Kuhn poker and Nim are the config's tags).
GAMES = {
    "KuhnPoker": ["custom_envs.KuhnPoker.max_tokens_per_step=12"],
    "Nim": [],
    "TicTacToe": [
        "custom_envs.TicTacToe.env_type=tic_tac_toe",
        "custom_envs.TicTacToe.max_steps=6",
        "custom_envs.TicTacToe.max_tokens_per_step=12",
        "custom_envs.TicTacToe.system_prompt='Reply with your move inside <answer></answer>.'",
    ],
    "ArenaTicTacToe": [
        "custom_envs.ArenaTicTacToe.env_type=textarena:TicTacToe-v0",
        "custom_envs.ArenaTicTacToe.max_tokens_per_step=12",
        "custom_envs.ArenaTicTacToe.stop=[']']",
        "custom_envs.ArenaTicTacToe.system_prompt='Reply with your move in square brackets, for example [4].'",
    ],
}


def games(seats: str) -> list[str]:
    """Overrides that train every game of :data:`GAMES`, one env group each, with ``seats``."""
    return [
        f"train_env_manager.tags=[{','.join(GAMES)}]",
        f"train_env_manager.num_env_groups={len(GAMES)}",
        *(o for overrides in GAMES.values() for o in overrides),
        *(f"custom_envs.{tag}.seats={seats}" for tag in GAMES),
    ]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def train(engine, out: Path, steps: int, *overrides: str, opponents=None):
    config = load_config(
        REPO / "configs" / "selfplay.yaml",
        [
            f"output_dir={out}",
            f"max_steps={steps}",
            *IN_PROCESS,
            "train_env_manager.tags=[KuhnPoker]",
            *GAMES["KuhnPoker"],
            *overrides,
        ],
    )
    run = await AgenticPipeline(
        config, engines=[engine], opponent_engines=opponents or {}
    ).run()
    metrics = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] >= 0]
    assert [m["step"] for m in metrics] == list(range(steps))
    versions = [m["weight_version"] for m in metrics]
    assert versions == [versions[0] + s for s in range(steps)]
    assert all(m["train/loss"] is not None for m in metrics), metrics
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == config.rollout_batch_size * steps
    return trajectories


def assert_games(
    trajectories: list[dict], roles: set[str], group_size: int = 2
) -> None:
    """Each group holds group_size games, each game one trajectory per policy seat, zero-sum between them."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for trajectory in trajectories:
        assert trajectory["stop_reason"] != "env_error", trajectory["error"]
        groups[trajectory["group_id"]].append(trajectory)
    for members in groups.values():
        assert len({t["seed"] for t in members}) == 1
        assert len({t["tag"] for t in members}) == 1
        games: dict[int, list[dict]] = defaultdict(list)
        for trajectory in members:
            games[trajectory["episode_id"]].append(trajectory)
        assert len(games) == group_size
        for seats in games.values():
            assert {t["role"] for t in seats} == roles
            if len(seats) == 2:
                assert sum(t["episode_reward"] for t in seats) == 0.0


def assert_hidden_cards_stay_hidden(trajectories: list[dict]) -> None:
    """A Kuhn poker seat's text holds its own card only (none when the game ended before its turn)."""
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    for trajectory in trajectories:
        if trajectory["tag"] != "KuhnPoker":
            continue
        own = set(re.findall(r"Your card: (\w+)", trajectory["text"]))
        assert len(own) <= 1, trajectory["text"]
        seen[(trajectory["group_id"], trajectory["episode_id"])] += sorted(own)
    assert all(len(set(cards)) == len(cards) for cards in seen.values())


@pytest.mark.timeout(420)
async def test_every_game_trains_three_steps_in_self_play_sync_and_async(
    engine, tmp_path
):
    pytest.importorskip("textarena")
    # a batch is every game's group: one per tag x 2 games x 2 seats
    batch = f"rollout_batch_size={len(GAMES) * 2 * 2}"
    for mode in ("sync", "async"):
        trajectories = await train(
            engine,
            tmp_path / mode,
            3,
            batch,
            f"mode={mode}",
            *(["max_staleness=1"] if mode == "async" else []),
            *games("[policy,policy]"),
        )
        assert_games(trajectories, {"seat0", "seat1"})
        assert {t["tag"] for t in trajectories} == set(GAMES), mode
        assert_hidden_cards_stay_hidden(trajectories)


@pytest.mark.timeout(300)
async def test_a_full_weight_run_plays_snapshot_1_on_an_engine_of_its_own_one_sync_back(
    engine, tmp_path
):
    """Kuhn poker against ``snapshot:1`` without LoRA: the pipeline launches one engine for lag 1, gives it
    the start weights with the session engine, then after each sync the weights of the sync before."""
    config = load_config(
        REPO / "configs" / "selfplay.yaml",
        [
            f"output_dir={tmp_path}",
            "max_steps=3",
            *IN_PROCESS,
            "train_env_manager.tags=[KuhnPoker]",
            "train_env_manager.num_env_groups=1",
            "rollout_batch_size=2",  # one trained seat x 2 games
            *GAMES["KuhnPoker"],
            "custom_envs.KuhnPoker.seats=[snapshot:1,policy]",
        ],
    )
    assert config.trainer.lora.rank == 0
    pipeline = AgenticPipeline(config, engines=[engine])
    run = await pipeline.run()
    metrics = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] >= 0]
    versions = [m["weight_version"] for m in metrics]
    assert versions == [versions[0] + s for s in range(3)]
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 3 * 2
    assert_games(trajectories, {"seat1"})
    assert {t["opponents"] for t in trajectories} == {"snapshot"}
    assert {t["metrics"]["game_snapshot_lag_seat0"] for t in trajectories} == {1.0}
    # weight_version is logged after each step's sync: after the last one the lag-1 engine held the one before
    assert pipeline.snapshots.held == {1: versions[-1] - 1}
    assert pipeline.snapshot_engines == {}  # shut down with the run
