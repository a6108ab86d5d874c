"""SFT warm start: partial expert demos rendered token-exactly, and a loss that falls fast."""

from __future__ import annotations

import re

import pytest
import torch

from roll_async.config.schema import TrainerConfig
from roll_async.envs import make_env
from roll_async.envs.multiplayer import HEURISTICS, make_game
from roll_async.errors import InvalidInputError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trainer import GRPOTrainer
from roll_async.trainer.sft import (
    build_sft_examples,
    collate_sft,
    kept_turns,
    run_sft,
    sft_loss,
)

SYSTEM = "You are an agent solving a task step by step. Reply with your action inside <answer></answer>."


def test_kept_turns_rule():
    assert [kept_turns(n, 0.5) for n in (1, 2, 5, 8)] == [1, 1, 2, 4]
    assert (
        kept_turns(5, 0.0) == 0 and kept_turns(5, 1.0) == 5 and kept_turns(0, 0.5) == 0
    )


def test_demo_rendering_masks_exactly_the_assistant_turns(tokenizer):
    examples = build_sft_examples(
        "sokoban", {}, [0, 1, 2], tokenizer, SYSTEM, demo_fraction=0.5
    )
    assert len(examples) == 3
    env = make_env("sokoban", {})
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    for example in examples:
        observation, info = env.reset(seed=example.seed)
        responses = env.expert_responses()
        assert example.demo_turns == len(responses) and example.num_turns == kept_turns(
            len(responses), 0.5
        )
        prompt = builder.first_turn_ids(f"{info['instruction']}\n{observation}")
        assert example.input_ids[: len(prompt)] == prompt and not any(
            example.loss_mask[: len(prompt)]
        )
        learned = tokenizer.decode(
            [t for t, m in zip(example.input_ids, example.loss_mask) if m]
        )
        assert learned == "".join(
            r + "<|im_end|>" for r in responses[: example.num_turns]
        )
        assert not example.success  # half a demo does not solve the room
        assert tokenizer.decode(example.input_ids).endswith("<|im_end|>\n")


def test_full_demos_solve_their_episodes(tokenizer):
    examples = build_sft_examples(
        "sokoban", {}, [3, 4], tokenizer, SYSTEM, demo_fraction=1.0
    )
    assert examples and all(e.success and e.num_turns == e.demo_turns for e in examples)
    assert (
        build_sft_examples("sokoban", {}, [3], tokenizer, SYSTEM, demo_fraction=0.0)
        == []
    )


def test_sft_lowers_the_loss_substantially(tiny_model_path, tokenizer):
    examples = build_sft_examples(
        "sokoban", {}, range(4), tokenizer, SYSTEM, demo_fraction=0.5
    )
    trainer = GRPOTrainer(TrainerConfig(kl_coef=0.1), tiny_model_path)
    batch = collate_sft(examples, tokenizer.pad_token_id)
    with torch.no_grad():
        before = float(sft_loss(trainer.model, batch))
    metrics = run_sft(trainer, examples, steps=20, lr=3e-3, batch_size=4)
    with torch.no_grad():
        after = float(sft_loss(trainer.model, batch))
    assert metrics["sft/loss/first"] == pytest.approx(before, rel=1e-4)
    assert after < 0.4 * before, (before, after)
    assert metrics["sft/examples"] == 4 and metrics["sft/demo_success_rate"] == 0.0
    # the KL reference now anchors to the warmed-up policy, not the random init
    for (_, a), (_, b) in zip(
        trainer.model.named_parameters(), trainer.ref_model.named_parameters()
    ):
        assert torch.equal(a, b)


def test_run_sft_without_examples_is_a_clear_error(tiny_model_path):
    trainer = GRPOTrainer(TrainerConfig(), tiny_model_path)
    with pytest.raises(ValueError, match="no examples"):
        run_sft(trainer, [], steps=1, lr=1e-3, batch_size=1)


def _heuristic_game(game_name: str, seed: int) -> tuple[int, list[str], list[str]]:
    """(the demo's seat, that seat's observations, its replies) of one heuristic self-play game."""
    game = make_game(game_name)
    player = HEURISTICS[game_name]
    seat = seed % game.num_players
    game.reset(seed)
    observations: list[str] = []
    replies: list[str] = []
    done = False
    while not done:
        seen = game.get_observation()
        reply = game.format_action(player(seen.text, list(seen.legal_actions)))
        if seen.seat == seat:
            observations.append(seen.text)
            replies.append(reply)
        done = game.step(reply).done
    return seat, observations, replies


@pytest.mark.parametrize("game_name", ["tic_tac_toe", "kuhn_poker"])
def test_game_demos_are_a_seats_conversation_with_the_heuristics_moves(
    tokenizer, game_name
):
    examples = build_sft_examples(
        game_name, {}, [0, 1, 2, 3], tokenizer, SYSTEM, demo_fraction=0.5
    )
    assert [e.seed for e in examples] == [0, 1, 2, 3]
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    game = make_game(game_name)
    for example in examples:
        seat, observations, replies = _heuristic_game(game_name, example.seed)
        keep = kept_turns(len(replies), 0.5)
        assert (example.demo_turns, example.num_turns) == (len(replies), keep)
        first = f"{game.instruction(seat)}\n{observations[0]}"
        reply_ids = [builder.encode(r) for r in replies[:keep]]
        # token-exact with how a policy seat's rollout renders the same turns
        rollout = builder.incremental_ids([first, *observations[1:keep]], reply_ids)
        assert example.input_ids == rollout + builder.closure_ids_after(reply_ids[-1])
        learned = tokenizer.decode(
            [t for t, m in zip(example.input_ids, example.loss_mask) if m]
        )
        assert learned == "".join(r + "<|im_end|>" for r in replies[:keep])
    # both seats are demonstrated, and tic-tac-toe's partial demos stop before the game's end
    assert {e.seed % 2 for e in examples} == {0, 1}
    if game_name == "tic_tac_toe":
        assert all(e.num_turns < e.demo_turns and not e.success for e in examples)


def test_random_demos_play_every_legal_move_in_the_format_and_reach_the_games_end(
    tokenizer,
):
    """sft_warmup.demonstrator=random: both seats of each demo game are the random player."""
    seeds = list(range(40))
    examples = build_sft_examples(
        "nim", {}, seeds, tokenizer, SYSTEM, demo_fraction=1.0, demonstrator="random"
    )
    assert [e.seed for e in examples] == seeds
    moves = [
        tokenizer.decode([t for t, m in zip(e.input_ids, e.loss_mask) if m])
        for e in examples
    ]
    taken = {m for text in moves for m in re.findall(r"<answer>(\d)</answer>", text)}
    assert taken == {"1", "2", "3"}  # no strategy: every amount is demonstrated
    assert all(e.num_turns == e.demo_turns for e in examples)  # whole games
    # the demonstrated seat wins some and loses some: the demos carry no winning rule
    assert 0 < sum(e.success for e in examples) < len(examples)
    heuristic = build_sft_examples(
        "nim", {}, seeds, tokenizer, SYSTEM, demo_fraction=1.0
    )
    assert [e.input_ids for e in heuristic] != [e.input_ids for e in examples]


def test_random_demos_are_for_games_only(tokenizer):
    with pytest.raises(InvalidInputError, match="sft_warmup.demonstrator=expert"):
        build_sft_examples(
            "frozen_lake", {}, [0], tokenizer, SYSTEM, demonstrator="random"
        )
