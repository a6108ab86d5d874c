"""Games with seats: the contract for N players taking turns (one observation per seat, per-seat rewards), three built-in games, scripted players and the registry that builds games by name.

A ``custom_envs`` tag plays a game when it lists its ``seats`` (roll_async.config.seat_rules);
``seats`` checks such a list against its game, and env_managers/game_episode.py plays it.
"""

from roll_async.envs.multiplayer.base import (
    Game,
    GameOutcome,
    SeatObservation,
    TurnResult,
)
from roll_async.envs.multiplayer.kuhn_poker import KuhnPoker
from roll_async.envs.multiplayer.match import play_match
from roll_async.envs.multiplayer.nim import Nim, NimConfig
from roll_async.envs.multiplayer.players import (
    HEURISTICS,
    Player,
    kuhn_poker_heuristic,
    nim_heuristic,
    random_player,
    tic_tac_toe_heuristic,
)
from roll_async.envs.multiplayer.referee import GameConfig
from roll_async.envs.multiplayer.registry import (
    check_seats,
    make_game,
    registered_games,
)
from roll_async.envs.multiplayer.tic_tac_toe import TicTacToe

__all__ = [
    "HEURISTICS",
    "Game",
    "GameConfig",
    "GameOutcome",
    "KuhnPoker",
    "Nim",
    "NimConfig",
    "Player",
    "SeatObservation",
    "TicTacToe",
    "TurnResult",
    "check_seats",
    "kuhn_poker_heuristic",
    "make_game",
    "nim_heuristic",
    "play_match",
    "random_player",
    "registered_games",
    "tic_tac_toe_heuristic",
]
