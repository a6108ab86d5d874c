"""Games with seats train end to end on the session's real CPU engine: ``configs/selfplay.yaml``'s Kuhn poker tag.

Self-play trains 3 steps in sync mode, a policy seat against the built-in heuristic trains 3 steps in
async mode, and a real TextArena two-player game (``textarena:TicTacToe-v0``, offline) trains one step
against a random seat (``frozen:`` and ``snapshot:`` seats train in test_lora.py, whose LoRA engine
serves them). The tiny random-init model rarely writes a legal move, so the checks are what
every step must show: whole batches of one trajectory per policy seat and game, each role in every group,
rewards that sum to 0 per game, a finite loss and weight versions rising by one.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMMON = [
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=2",
    "trainer.lr=1e-3",
    "trainer.micro_batch_size=4",
    "logging.progress_bar=false",
    "logging.console=false",
    "sft_warmup.enabled=false",
    "eval_steps=0",
    "train_env_manager.tags=[KuhnPoker]",
    "custom_envs.KuhnPoker.max_tokens_per_step=12",
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def train(engine, out: Path, steps: int, *overrides: str, opponents=None):
    config = load_config(
        REPO / "configs" / "selfplay.yaml",
        [f"output_dir={out}", f"max_steps={steps}", *COMMON, *overrides],
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
        games: dict[int, list[dict]] = defaultdict(list)
        for trajectory in members:
            games[trajectory["episode_id"]].append(trajectory)
        assert len(games) == group_size
        for seats in games.values():
            assert {t["role"] for t in seats} == roles
            if len(seats) == 2:
                assert sum(t["episode_reward"] for t in seats) == 0.0


@pytest.mark.timeout(300)
async def test_selfplay_config_trains_sync_and_async_against_a_scripted_seat(
    engine, tmp_path
):
    selfplay = await train(engine, tmp_path / "sync", 3, "rollout_batch_size=4")
    assert_games(selfplay, {"seat0", "seat1"})
    # a seat's text holds its own card only (none when the game ended before its turn); the seats' differ
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    for trajectory in selfplay:
        own = set(re.findall(r"Your card: (\w+)", trajectory["text"]))
        assert len(own) <= 1, trajectory["text"]
        seen[(trajectory["group_id"], trajectory["episode_id"])] += sorted(own)
    assert all(len(set(cards)) == len(cards) for cards in seen.values())
    against_heuristic = await train(
        engine,
        tmp_path / "async",
        3,
        "rollout_batch_size=4",
        "mode=async",
        "max_staleness=1",
        "custom_envs.KuhnPoker.seats=[policy,heuristic]",
    )
    assert_games(against_heuristic, {"seat0"})


@pytest.mark.timeout(300)
async def test_a_textarena_two_player_game_trains_offline(engine, tmp_path):
    pytest.importorskip("textarena")
    trajectories = await train(
        engine,
        tmp_path / "textarena",
        1,
        "rollout_batch_size=4",
        "custom_envs.KuhnPoker.env_type=textarena:TicTacToe-v0",
        "custom_envs.KuhnPoker.seats=[random,policy]",
        "custom_envs.KuhnPoker.stop=[']']",
        "custom_envs.KuhnPoker.system_prompt='Reply with your move in square brackets, for example [4].'",
    )
    assert_games(trajectories, {"seat1"})
