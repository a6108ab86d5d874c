"""``textarena:<GameId>`` through the seat contract, on the real library's offline two-player games (no model)."""

from __future__ import annotations

import pytest

from roll_async.envs.multiplayer import make_game, play_match, random_player
from roll_async.errors import ConfigError, LifecycleError

pytest.importorskip("textarena")


@pytest.mark.parametrize("game_id", ["TicTacToe-v0", "KuhnPoker-v0"])
def test_random_players_finish_textarena_games_zero_sum_from_the_listed_moves(game_id):
    game = make_game(f"textarena:{game_id}")
    for seed in range(15):
        players = [random_player(seed + 10_000), random_player(seed + 20_000)]
        outcome = play_match(game, players, seed)
        assert (
            outcome.zero_sum
            and sum(outcome.rewards) == 0
            and outcome.invalid_moves == (0, 0)
        )
        assert outcome.reason
    assert "Player 1" in game.instruction(1) and "Player 0" in game.instruction(0)


def test_textarena_invalid_moves_are_counted_for_the_seat_that_made_them():
    game = make_game("textarena:TicTacToe-v0")
    game.reset(0)
    assert game.step(game.format_action("4")).invalid is False
    result = game.step("I pass")  # TextArena allows one retry ...
    assert (result.seat, result.invalid, result.done) == (1, True, False)
    assert "invalid move" in game.get_observation().text
    result = game.step("[4]")  # ... and the second invalid move loses
    assert result.invalid and result.done and "occupied" in result.reason
    outcome = game.close()
    assert outcome.rewards == (1.0, -1.0) and outcome.invalid_moves == (0, 2)


def test_a_seat_sees_the_games_account_of_a_move_not_the_other_seats_reply():
    for share in (False, True):
        game = make_game("textarena:KuhnPoker-v0", {"share_replies": share})
        game.reset(3)
        first = game.get_observation()
        assert "Your card is" in first.text and first.legal_actions == ("check", "bet")
        assert game.get_observation() == first  # kept until the move
        game.step("my card is secret-word-xyz [bet]")
        second = game.get_observation()
        assert (
            second.seat == 1 - first.seat and "submitted move: '[bet]'" in second.text
        )
        assert ("secret-word-xyz" in second.text) == share
        assert second.legal_actions == ("fold", "call")


def test_textarena_games_that_reach_the_network_or_misfit_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="downloads NLTK word lists.*allow_network"):
        make_game("textarena:Codenames-v0")
    with pytest.raises(ConfigError, match="calls an LLM jury"):
        make_game("textarena:Debate-v0")
    with pytest.raises(ConfigError, match="close matches: TicTacToe-v0"):
        make_game("textarena:TicTacToo-v0")
    game = make_game("textarena:TicTacToe-v0", {"num_players": 3})
    with pytest.raises(ConfigError, match="does not take env_config.num_players=3"):
        game.reset(0)


def test_textarena_rewards_that_break_zero_sum_name_the_key_that_allows_it():
    game = make_game("textarena:TicTacToe-v0")
    with pytest.raises(LifecycleError, match="before reset"):
        game.get_observation()
    play_match(game, [random_player(1), random_player(2)], 0)
    game.game.close = lambda: ({0: 1, 1: 1}, {})  # a game that pays both seats
    with pytest.raises(
        ConfigError, match="do not sum to 0; set env_config.zero_sum: false"
    ):
        game.close()
    relaxed = make_game("textarena:TicTacToe-v0", {"zero_sum": False})
    play_match(relaxed, [random_player(1), random_player(2)], 0)
    relaxed.game.close = lambda: ({0: 1, 1: 1}, {})
    assert relaxed.close().rewards == (1.0, 1.0)
