"""Nim, the self-play demo's game: its rules, its invalid-move rule, what each seat sees, and its heuristic's margin over chance."""

from __future__ import annotations

import pytest

from roll_async.envs.multiplayer import (
    HEURISTICS,
    Nim,
    make_game,
    nim_heuristic,
    play_match,
    random_player,
)
from roll_async.envs.multiplayer.nim import parse_pile
from roll_async.envs.multiplayer.players import Player
from roll_async.errors import ConfigError


def win_rate(player: Player, seat: int, games: int) -> float:
    """``player``'s win rate in ``seat`` against the random player over ``games`` seeded games."""
    game, wins = Nim(), 0
    for seed in range(games):
        players = [random_player(seed * 2 + s + 10_000) for s in (0, 1)]
        players[seat] = player
        wins += play_match(game, players, seed).rewards[seat] > 0
    return wins / games


def test_the_pile_comes_from_the_seed_within_the_configured_range():
    piles = set()
    for seed in range(300):
        a, b = Nim(), Nim()
        a.reset(seed)
        b.reset(seed)
        assert a.pile == b.pile and 5 <= a.pile <= 15
        piles.add(a.pile)
    assert piles == set(range(5, 16))
    small = Nim({"min_stones": 2, "max_stones": 2, "max_take": 5})
    small.reset(0)
    assert small.pile == 2 and small.legal_actions() == ("1", "2")


def test_moves_take_stones_and_whoever_takes_the_last_one_wins():
    game = Nim()
    seed = next(s for s in range(100) if (game.reset(s), game.pile)[1] == 7)
    game.reset(seed)
    seen = game.get_observation()
    assert seen.seat == 0 and seen.legal_actions == ("1", "2", "3")
    assert "Stones left: 7." in seen.text and "Legal moves: 1, 2, 3." in seen.text
    assert not game.step("I take <answer>3</answer>").done  # 4 left
    seen = game.get_observation()
    assert seen.seat == 1 and seen.text.startswith("Player 0 took 3; 4 left.")
    assert parse_pile(seen.text) == 4
    assert not game.step("<answer> 1 </answer>").done  # 3 left
    seen = game.get_observation()
    assert parse_pile(seen.text) == 3 and seen.legal_actions == ("1", "2", "3")
    result = game.step("<answer>3</answer>")
    assert result.done and not result.invalid and result.seat == 0
    outcome = game.close()
    assert outcome.rewards == (1.0, -1.0) and outcome.invalid_moves == (0, 0)
    assert outcome.zero_sum and "Player 0 took the last 3 and wins" in outcome.reason


def test_taking_more_than_the_pile_is_illegal_retried_then_forfeited():
    game = Nim()
    seed = next(s for s in range(100) if (game.reset(s), game.pile)[1] == 6)
    game.reset(seed)
    game.step("<answer>3</answer>")
    game.step("<answer>1</answer>")  # 2 left, seat 0 to move
    seen = game.get_observation()
    assert seen.legal_actions == ("1", "2")
    result = game.step("<answer>3</answer>")
    assert (result.seat, result.invalid, result.done) == (0, True, False)
    assert "'3' is not a legal move now; legal: 1, 2" in result.reason
    seen = game.get_observation()
    assert seen.seat == 0 and "Invalid move" in seen.text and parse_pile(seen.text) == 2
    for bad in (
        "<answer>0</answer>",
        "<answer>-1</answer>",
        "two",
        "<answer>4</answer>",
    ):
        probe = Nim()
        probe.reset(seed)
        assert probe.step(bad).invalid, bad
    result = game.step("<answer>three</answer>")  # the second invalid move of the turn
    assert result.invalid and result.done
    outcome = game.close()
    assert outcome.rewards == (-1.0, 1.0) and outcome.invalid_moves == (2, 0)
    assert "Player 0 forfeits" in outcome.reason


def test_a_seat_sees_the_pile_the_legal_moves_and_the_other_seats_move_only_as_the_game_tells_it():
    game = Nim()
    for seed in range(50):
        game.reset(seed)
        pile, texts = game.pile, ([], [])
        while True:
            seen = game.get_observation()
            texts[seen.seat].append(seen.text)
            assert parse_pile(seen.text) == game.pile
            assert f"Legal moves: {', '.join(seen.legal_actions)}." in seen.text
            assert f"You are Player {seen.seat}." in seen.text
            take = seen.legal_actions[-1]
            if game.step(f"secret-{seen.seat} <answer>{take}</answer>").done:
                break
        assert parse_pile(texts[0][0]) == pile
        for seat in (0, 1):
            assert not any(f"secret-{1 - seat}" in t for t in texts[seat])


def test_rewards_sum_to_zero_and_random_players_move_legally():
    game = make_game("nim")
    for seed in range(300):
        outcome = play_match(
            game, [random_player(seed + 10_000), random_player(seed + 20_000)], seed
        )
        assert sum(outcome.rewards) == 0 and set(outcome.rewards) == {-1.0, 1.0}
        assert outcome.invalid_moves == (0, 0)


def test_the_heuristic_takes_the_pile_or_leaves_a_multiple_of_four():
    assert HEURISTICS["nim"] is nim_heuristic
    cases = {3: "3", 2: "2", 7: "3", 6: "2", 5: "1", 9: "1", 8: "1", 4: "1", 15: "3"}
    for pile, take in cases.items():
        legal = [str(k) for k in range(1, min(3, pile) + 1)]
        assert (
            nim_heuristic(f"Player 1 took 2; 99 left.\nStones left: {pile}.", legal)
            == take
        ), pile


def test_the_heuristic_beats_the_random_player_by_a_wide_margin_in_either_seat():
    games = 400
    heuristic = tuple(win_rate(nim_heuristic, seat, games) for seat in (0, 1))
    chance = tuple(win_rate(random_player(7), seat, games) for seat in (0, 1))
    assert min(heuristic) > 0.9, heuristic
    assert max(chance) < 0.6 and min(chance) > 0.4, chance
    assert min(heuristic) - max(chance) > 0.3


def test_the_instruction_names_the_seat_the_limit_and_the_answer_format():
    game = make_game("nim", {"max_take": 4, "action_pattern": r"\[(.*?)\]"})
    text = game.instruction(1)
    assert "Player 1" in text and "1 to 4 stones" in text and "[1]" in text
    assert game.format_action("2") == "[2]"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_take": 0}, "max_take must be >= 1, got 0"),
        ({"min_stones": 9, "max_stones": 4}, "min_stones=9, max_stones=4"),
        ({"min_stones": 0}, "1 <= min_stones"),
        (
            {"pile": 3},
            "'pile' is not accepted by nim; accepted keys: action_pattern, error_allowance, min_stones, max_stones, max_take",
        ),
    ],
)
def test_a_config_nim_cannot_play_fails_naming_the_key(config, message):
    with pytest.raises(ConfigError, match=message):
        make_game("nim", config)
