"""The seat contract's built-in games (tic-tac-toe, Kuhn poker; Nim has its own file), their players, the game registry and the one-seat check."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from roll_async.envs import make_env
from roll_async.envs.multiplayer import (
    HEURISTICS,
    GameOutcome,
    KuhnPoker,
    TicTacToe,
    check_seats,
    make_game,
    play_match,
    random_player,
)
from roll_async.envs.multiplayer.kuhn_poker import CARDS
from roll_async.envs.multiplayer.players import Player
from roll_async.envs.multiplayer.tic_tac_toe import parse_board, render_board
from roll_async.errors import ConfigError, InvalidInputError, LifecycleError

PAYOFFS = {
    "tic_tac_toe": {-1.0, 0.0, 1.0},
    "kuhn_poker": {-2.0, -1.0, 1.0, 2.0},
    "nim": {-1.0, 1.0},
}


def recorded(player: Player, seen: list[tuple[str, tuple[str, ...], str]]) -> Player:
    """``player``, writing down each observation, legal list and answer it gave."""

    def play(text: str, legal: Sequence[str]) -> str:
        action = player(text, legal)
        seen.append((text, tuple(legal), action))
        return action

    return play


@pytest.mark.parametrize("name", ["tic_tac_toe", "kuhn_poker", "nim"])
def test_random_games_end_zero_sum_and_random_players_play_only_legal_moves(name):
    game = make_game(name)
    for seed in range(300):
        seen: list[tuple[str, tuple[str, ...], str]] = []
        players = [recorded(random_player(seed * 2 + s + 10_000), seen) for s in (0, 1)]
        outcome = play_match(game, players, seed)
        assert outcome.zero_sum and sum(outcome.rewards) == 0
        assert set(outcome.rewards) <= PAYOFFS[name] and outcome.invalid_moves == (0, 0)
        assert seen and all(action in legal for _, legal, action in seen)


def test_the_tic_tac_toe_heuristic_never_loses_to_random_and_draws_itself():
    game, heuristic = TicTacToe(), HEURISTICS["tic_tac_toe"]
    for seat in (0, 1):
        rewards = []
        for seed in range(200):
            players = [random_player(seed + 10_000)] * 2
            players[seat] = heuristic
            rewards.append(play_match(game, players, seed).rewards[seat])
        assert min(rewards) >= 0 and sum(rewards) > 150, (seat, rewards.count(0.0))
    assert play_match(game, [heuristic, heuristic], 0).rewards == (0.0, 0.0)


def test_the_kuhn_heuristic_wins_chips_from_random_in_either_seat():
    game, heuristic = KuhnPoker(), HEURISTICS["kuhn_poker"]
    for seat in (0, 1):
        total = 0.0
        for seed in range(400):
            players = [random_player(seed + 10_000)] * 2
            players[seat] = heuristic
            total += play_match(game, players, seed).rewards[seat]
        assert total / 400 > 0.15, (seat, total / 400)


def test_a_kuhn_seat_never_sees_the_other_card_nor_the_other_raw_reply():
    game = KuhnPoker()
    for seed in range(100):
        chooser, texts = random_player(seed + 10_000), ([], [])
        game.reset(seed)
        while True:
            seen = game.get_observation()
            texts[seen.seat].append(seen.text)
            # a reply that gives its card away: only the game's own account of the move may reach the other seat
            action = chooser(seen.text, seen.legal_actions)
            reply = f"I hold the {CARDS[game.cards[seen.seat]]}, so <answer>{action}</answer>"
            if game.step(reply).done:
                break
        for seat in (0, 1):
            mine, theirs = CARDS[game.cards[seat]], CARDS[game.cards[1 - seat]]
            assert texts[seat] and all(f"Your card: {mine}" in t for t in texts[seat])
            assert not any(theirs in t for t in texts[seat]), (seed, seat, texts[seat])


def test_kuhn_replies_in_the_tag_reach_the_game_and_the_payoffs_are_kuhns():
    cases = {  # actions in turn order -> seat 0's reward when seat 0 holds the King
        ("check", "check"): 1.0,
        ("bet", "call"): 2.0,
        ("bet", "fold"): 1.0,
        ("check", "bet", "call"): 2.0,
        ("check", "bet", "fold"): -1.0,
    }
    game = KuhnPoker()

    def deal(seed: int) -> tuple[int, int]:
        game.reset(seed)
        return game.cards

    seed = next(s for s in range(100) if deal(s)[0] == 2)  # seat 0 holds the King
    for actions, reward in cases.items():
        game.reset(seed)
        for i, action in enumerate(actions):
            assert game.get_observation().seat == i % 2
            result = game.step(f"thinking... <answer>{action.upper()}</answer>")
            assert not result.invalid and result.done == (i == len(actions) - 1)
        outcome = game.close()
        assert outcome.rewards == (reward, -reward), actions
        assert ("Showdown" in outcome.reason) == (actions[-1] != "fold")


def test_one_seed_deals_the_same_hand_to_every_game_of_a_group():
    deals = set()
    for seed in range(20):
        group = [KuhnPoker() for _ in range(4)]
        for game in group:
            game.reset(seed)
        assert len({game.get_observation().text for game in group}) == 1
        deals.add(group[0].cards)
    assert len(deals) == 6  # every ordered pair of distinct cards shows up


def test_invalid_moves_are_counted_per_seat_retried_then_forfeited():
    game = TicTacToe()
    game.reset(0)
    game.step("<answer>4</answer>")
    result = game.step("I take the corner")  # no tag
    assert (result.seat, result.invalid, result.done) == (1, True, False)
    seen = game.get_observation()
    assert seen.seat == 1 and "Invalid move (no action found" in seen.text
    result = game.step(
        "<answer>4</answer>"
    )  # taken: the second invalid move in this turn
    assert result.invalid and result.done and "not a legal move" in result.reason
    outcome = game.close()
    assert outcome.rewards == (1.0, -1.0) and outcome.invalid_moves == (0, 2)
    assert "forfeits" in outcome.reason

    strict = KuhnPoker({"error_allowance": 0})
    strict.reset(0)
    strict.step("<answer>bet</answer>")
    assert strict.step("<answer>check</answer>").done  # illegal facing a bet: a fold
    assert strict.close().rewards == (1.0, -1.0) and strict.close().invalid_moves == (
        0,
        1,
    )


def test_a_valid_move_resets_the_allowance_for_the_next_turn():
    game = TicTacToe()
    game.reset(0)
    for reply in (
        "bad",
        "<answer>0</answer>",
        "bad",
        "<answer>1</answer>",
        "bad",
        "<answer>3</answer>",
    ):
        assert not game.step(reply).done
    assert game.referee.invalid_moves == [2, 1]


def test_calls_out_of_order_raise_lifecycle_errors():
    game = TicTacToe()
    with pytest.raises(LifecycleError, match="before reset"):
        game.step("<answer>4</answer>")
    game.reset(0)
    with pytest.raises(LifecycleError, match="before the game ended"):
        game.close()
    for cell in (0, 3, 1, 4, 2):
        game.step(f"<answer>{cell}</answer>")
    assert game.close().rewards == (1.0, -1.0)
    with pytest.raises(LifecycleError, match="after the game ended"):
        game.get_observation()


def test_the_action_pattern_is_configurable_and_shown_in_the_instruction():
    game = make_game("tic_tac_toe", {"action_pattern": r"\[(.*?)\]"})
    assert "[4]" in game.instruction(0) and game.format_action("4") == "[4]"
    assert "you play O" in game.instruction(1)
    game.reset(0)
    assert not game.step("[4]").invalid


def test_the_board_text_reads_back():
    cells = ["X", "", "O", "", "X", "", "", "", "O"]
    assert parse_board(f"news\n{render_board(cells)}\nLegal moves: 1.") == cells


def test_the_registry_names_what_it_accepts():
    with pytest.raises(
        ConfigError, match="unknown game 'tic_tac'.*kuhn_poker, nim, tic_tac_toe"
    ):
        make_game("tic_tac")
    with pytest.raises(
        ConfigError,
        match="'max_steps' is not accepted by kuhn_poker; accepted keys: action_pattern, error_allowance",
    ):
        make_game("kuhn_poker", {"max_steps": 3})
    with pytest.raises(ConfigError, match="error_allowance must be >= 0"):
        make_game("kuhn_poker", {"error_allowance": -1})
    with pytest.raises(ConfigError, match="gymnasium: adapter has no seats"):
        make_game("gymnasium:FrozenLake-v1")
    assert isinstance(
        make_game("roll_async.envs.multiplayer.kuhn_poker:KuhnPoker"), KuhnPoker
    )


def test_a_game_given_where_one_seat_plays_fails_at_load_naming_the_key():
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Poker\.env_type='kuhn_poker' is a 2-player game, but 1 seat is configured",
    ):
        check_seats("kuhn_poker", "custom_envs.Poker.env_type")
    check_seats("kuhn_poker", "custom_envs.Poker.env_type", seats=2)
    check_seats("sokoban", "custom_envs.Sokoban.env_type")
    for env_type in (
        "tic_tac_toe",
        "roll_async.envs.multiplayer.tic_tac_toe:TicTacToe",
    ):
        with pytest.raises(
            ConfigError,
            match=r"env_type=.* is a 2-player game.*custom_envs.<Tag>.seats",
        ):
            make_env(env_type)


def test_an_outcome_that_breaks_zero_sum_is_refused():
    with pytest.raises(
        InvalidInputError, match="sum to 2.0, but the game declares itself zero-sum"
    ):
        GameOutcome(rewards=(1.0, 1.0), zero_sum=True, invalid_moves=(0, 0))
    assert GameOutcome(
        rewards=(1.0, 1.0), zero_sum=False, invalid_moves=(0, 0)
    ).rewards == (1.0, 1.0)
    with pytest.raises(InvalidInputError, match="one of each per seat"):
        GameOutcome(rewards=(1.0, -1.0), zero_sum=True, invalid_moves=(0,))


def test_play_match_needs_one_player_per_seat():
    with pytest.raises(InvalidInputError, match="1 players for a 2-player game"):
        play_match(TicTacToe(), [random_player(0)], 0)
