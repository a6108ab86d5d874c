"""The contract of a game with seats: whose turn it is, what that seat may see, one action per turn, rewards per seat.

It has the shape of TextArena's (``get_observation() -> (player_id, obs)``,
``step(action) -> (done, info)``, ``close() -> rewards``), so the built-in games and the
``textarena:`` adapter are driven the same way, and the records below are what a seat
scheduler will hand around. A seat's observation holds only what that seat may know.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from roll_async.errors import InvalidInputError


@dataclass(frozen=True)
class SeatObservation:
    """What the seat to move sees now: the news since its last turn and the state it may know.

    Attributes:
        seat: The seat whose turn it is (0-based).
        text: That seat's observation; never anything only another seat may know.
        legal_actions: The action words the game accepts now, bare (``"4"``, ``"bet"``);
            empty when the game does not list them (free-form moves).
    """

    seat: int
    text: str
    legal_actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnResult:
    """What one ``step`` did.

    Attributes:
        seat: The seat that moved.
        done: The game is over; ``close()`` gives the outcome.
        invalid: The move broke the game's rules (unparseable or illegal); counted per seat.
        reason: Why the move was invalid ("" when it was valid).
    """

    seat: int
    done: bool
    invalid: bool = False
    reason: str = ""


@dataclass(frozen=True)
class GameOutcome:
    """How a finished game ended: one reward per seat, checked to sum to 0 when the game is zero-sum.

    Attributes:
        rewards: The reward of each seat, in seat order.
        zero_sum: The game declares its rewards sum to 0 (checked here).
        invalid_moves: Invalid moves each seat made, in seat order.
        reason: The game's own words on how it ended (public to every seat).
    """

    rewards: tuple[float, ...]
    zero_sum: bool
    invalid_moves: tuple[int, ...]
    reason: str = ""

    def __post_init__(self) -> None:
        if len(self.invalid_moves) != len(self.rewards):
            raise InvalidInputError(
                f"GameOutcome has {len(self.rewards)} rewards but {len(self.invalid_moves)} invalid-move "
                "counts; give one of each per seat"
            )
        if self.zero_sum and not math.isclose(sum(self.rewards), 0.0, abs_tol=1e-9):
            raise InvalidInputError(
                f"rewards {list(self.rewards)} sum to {sum(self.rewards)}, but the game declares itself "
                "zero-sum; fix the game's payoffs or set zero_sum=False"
            )


@runtime_checkable
class Game(Protocol):
    """A game for ``num_players`` seats, played one move at a time by whichever seat's turn it is.

    ``reset(seed)`` starts a game: everything random derives from the seed, so a group of
    games with one seed deals the same. Then, until ``step`` says ``done``:
    ``get_observation()`` tells whose turn it is and what that seat sees, and
    ``step(text)`` plays that seat's reply (the raw reply; a malformed or illegal one is
    the game's business, handled by its invalid-move rule and counted, never raised).
    ``close()`` gives the :class:`GameOutcome`. ``instruction(seat)`` is a seat's first
    turn's task text (the rules, its role, the action format), and ``format_action``
    writes an action word as a reply the game parses.
    """

    num_players: int

    def instruction(self, seat: int) -> str: ...

    def reset(self, seed: int) -> None: ...

    def get_observation(self) -> SeatObservation: ...

    def step(self, action_text: str) -> TurnResult: ...

    def close(self) -> GameOutcome: ...

    def format_action(self, action: str) -> str: ...
