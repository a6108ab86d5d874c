"""A game tag's seats against its game: the checks that need the game (how many seats, which players exist) and the scripted players themselves.

``roll_async.config.seat_rules`` reads each ``seats`` entry from the text alone;
what only the game can tell, its number of players, whether it has a built-in
heuristic, whether a scripted player's module imports, is checked here, by preflight,
before any actor starts, and the same code builds the players the env loop uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.config.seat_rules import SeatSpec, parse_seats, seat_key
from roll_async.envs.adapters import split_adapter_env_type
from roll_async.envs.adapters.textarena_game import TextArenaGame
from roll_async.envs.multiplayer.players import HEURISTICS, Player, random_player
from roll_async.envs.multiplayer.registry import check_seats, game_class
from roll_async.errors import ConfigError

#: A seat's scripted player for one game: ``seed -> Player`` (the random player draws from the seed).
PlayerFactory = Callable[[int], Player]


def game_num_players(env_type: str, env_config: Mapping[str, Any]) -> int:
    """The number of seats of the game ``env_type`` names, without building it (TextArena is not imported)."""
    adapter = split_adapter_env_type(env_type)
    if adapter is not None and adapter[0] == "textarena":
        return int(env_config.get("num_players", TextArenaGame.num_players))
    players = getattr(game_class(env_type), "num_players", 1)
    return players if isinstance(players, int) else 1


def check_game_seats(
    tag: str, env_type: str, env_config: Mapping[str, Any], seats: Sequence[str]
) -> list[SeatSpec]:
    """A game tag's seats checked against its game; ConfigError naming the key, before any actor starts.

    The seat list must have one entry per player; ``heuristic`` needs a built-in game that has one;
    a ``scripted:package.module:function`` must import and name a callable.

    Returns:
        The seats, read.
    """
    specs = parse_seats(tag, list(seats))
    key = f"custom_envs.{tag}.env_type"
    try:
        num_players = game_num_players(env_type, env_config)
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    check_seats(env_type, key, seats=len(specs), num_players=num_players)
    for spec in specs:
        if spec.kind == "scripted":
            seat_player_factory(tag, spec, env_type)
    return specs


def seat_player_factory(tag: str, spec: SeatSpec, env_type: str) -> PlayerFactory:
    """The scripted player of seat ``spec`` as ``seed -> Player``; ConfigError naming the seat's key."""
    key = seat_key(tag, spec.seat)
    if spec.player == "random":
        return random_player
    if spec.player == "heuristic":
        heuristic = HEURISTICS.get(env_type)
        if heuristic is None:
            raise ConfigError(
                f"{key}=heuristic: {env_type!r} has no built-in heuristic (games with one: "
                f"{', '.join(sorted(HEURISTICS))}); use random or scripted:package.module:function"
            )
        return _fixed(heuristic)
    player = resolve_dotted(spec.player, f"{key}='scripted:{spec.player}'")
    if not callable(player):
        raise ConfigError(
            f"{key}='scripted:{spec.player}' names {player!r}, which is not callable; name a function "
            "(observation_text, legal_actions) -> action"
        )
    return _fixed(player)


def _fixed(player: Player) -> PlayerFactory:
    def factory(seed: int) -> Player:
        return player

    return factory
