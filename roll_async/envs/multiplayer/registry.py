"""Build games with seats by name, and check that a name given where one seat plays is not such a game.

Names follow the env registry's: a registered name (``tic_tac_toe``, ``kuhn_poker``, ``nim``), the
adapter prefix ``textarena:<GameId>``, or a dotted path ``package.module:ClassName``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.envs.adapters import ADAPTER_PREFIXES, split_adapter_env_type
from roll_async.envs.adapters.textarena_game import TextArenaGame
from roll_async.envs.base import build_config
from roll_async.envs.multiplayer.base import Game
from roll_async.envs.multiplayer.kuhn_poker import KuhnPoker
from roll_async.envs.multiplayer.nim import Nim
from roll_async.envs.multiplayer.tic_tac_toe import TicTacToe
from roll_async.errors import ConfigError

#: Registered name -> game class.
GAMES: dict[str, type[Any]] = {
    "tic_tac_toe": TicTacToe,
    "kuhn_poker": KuhnPoker,
    "nim": Nim,
}


def registered_games() -> list[str]:
    return sorted(GAMES)


def make_game(name: str, config: Mapping[str, Any] | None = None) -> Game:
    """A new game (not yet reset) for a registered name, ``textarena:<GameId>`` or ``pkg.module:Class``.

    Args:
        name: The game's name.
        config: Its settings; a key the game does not accept fails naming the accepted ones.

    Raises:
        ConfigError: the name names no game, or the config does not fit it (a ``ValueError``).
    """
    adapter = split_adapter_env_type(name)
    if adapter is not None:
        prefix, game_id = adapter
        if prefix != "textarena":
            raise ConfigError(
                f"game {name!r}: the {prefix}: adapter has no seats; multi-player games come from "
                f"'textarena:<GameId>' (adapters: {', '.join(sorted(ADAPTER_PREFIXES))})"
            )
        return TextArenaGame(game_id, **dict(config or {}))
    cls = game_class(name)
    config_cls: type[Any] | None = getattr(cls, "config_cls", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        game: Game = cls(build_config(config_cls, config, name))
        return game
    game = cls(**dict(config or {}))
    return game


def check_seats(
    env_type: str,
    key: str,
    *,
    env_class: type | None = None,
    seats: int = 1,
    num_players: int | None = None,
) -> None:
    """ConfigError naming ``key`` when ``env_type`` is a game for another number of seats than ``seats``.

    ``num_players`` when given, else a registered game name is looked up here, else the class
    is read from ``env_class`` (its ``num_players``, 1 when it has none). A tag without
    ``custom_envs.<Tag>.seats`` plays one seat, so a multi-player game given as its
    ``env_type`` without seats fails at load with one line.

    Args:
        env_type: The name the config gives.
        key: The config key that holds it (``custom_envs.<Tag>.env_type``).
        env_class: The class the name resolved to, when it is not a registered game name.
        seats: The seats configured for it.
        num_players: The game's number of players, when the caller knows it (a TextArena game).
    """
    cls = GAMES.get(env_type, env_class)
    players = (
        num_players
        if num_players is not None
        else getattr(cls, "num_players", 1)
        if cls is not None
        else 1
    )
    if not isinstance(players, int) or players == seats:
        return
    if seats == 1:
        fix = (
            f"list who plays each of its {players} seats in custom_envs.<Tag>.seats (e.g. "
            f"[{', '.join(['policy'] + ['random'] * (players - 1))}]), or pick a single-agent env"
        )
    else:
        fix = f"list {players} seats, one per player"
    raise ConfigError(
        f"{key}={env_type!r} is a {players}-player game, but {seats} "
        f"{'seat is' if seats == 1 else 'seats are'} configured; {fix}"
    )


def game_class(name: str) -> type[Any]:
    """The class of a registered game name or a ``package.module:ClassName`` path (not an adapter)."""
    if name in GAMES:
        return GAMES[name]
    if ":" in name:
        obj = resolve_dotted(name, f"game {name!r}")
        if not isinstance(obj, type):
            raise ConfigError(f"game {name!r} names {obj!r}, which is not a class")
        return obj
    raise ConfigError(
        f"unknown game {name!r}; registered games: {', '.join(registered_games())}; or give "
        "'textarena:<GameId>' or a dotted path 'package.module:ClassName'"
    )
