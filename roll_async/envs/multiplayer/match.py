"""One game between scripted players, driven through the seat contract: the reference loop for a game's seats.

A seat scheduler will interleave model and scripted seats across episodes; this plays
them in one call, for tests, baselines and checking a new game (it must end, and its
outcome must hold).
"""

from __future__ import annotations

from collections.abc import Sequence

from roll_async.envs.multiplayer.base import Game, GameOutcome
from roll_async.envs.multiplayer.players import Player
from roll_async.errors import InvalidInputError


def play_match(
    game: Game, players: Sequence[Player], seed: int, max_turns: int = 1000
) -> GameOutcome:
    """Reset ``game`` with ``seed`` and play it to the end, each seat's move from its player.

    Args:
        game: Any :class:`~roll_async.envs.multiplayer.base.Game`.
        players: One player per seat, in seat order.
        seed: The game's seed.
        max_turns: Steps (invalid moves included) before the game is declared stuck.

    Returns:
        The game's outcome.

    Raises:
        InvalidInputError: the number of players is not the game's, or the game did not end
            within ``max_turns`` steps (a ``ValueError``).
    """
    if len(players) != game.num_players:
        raise InvalidInputError(
            f"play_match got {len(players)} players for a {game.num_players}-player game; give one per seat"
        )
    game.reset(seed)
    for _ in range(max_turns):
        seen = game.get_observation()
        action = players[seen.seat](seen.text, seen.legal_actions)
        if game.step(game.format_action(action)).done:
            return game.close()
    raise InvalidInputError(
        f"{type(game).__name__} did not end within max_turns={max_turns} steps (seed {seed}); "
        "raise max_turns or check that the game ends"
    )
