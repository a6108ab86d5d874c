"""Nim (the subtraction game) for two seats: the self-play demo's game, where illegal moves are not the bottleneck.

A pile of stones (its size drawn from the seed, ``min_stones``..``max_stones``) lies between
the seats; seat 0 moves first. A move takes 1..``max_take`` stones, never more than are left,
written in the configured tag, ``<answer>2</answer>`` by default; whoever takes the last stone
wins (+1 / -1). It exists because tic-tac-toe's later moves must name a free cell, which the
tiny model cannot read off the board, so its demo forfeited on invalid moves instead of learning:
here every amount up to ``max_take`` is legal until the pile is that small, and good play comes
in simple parts (take the whole pile when it can; leave a multiple of ``max_take + 1``, which
wins from any other pile) that beat the random player by a wide margin. An invalid move (no tag, not a
number, more than the pile) is told to its seat, which moves again up to ``error_allowance``
times in that turn; one more forfeits: the invalid mover loses (-1 / +1).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll_async.envs.base import build_config
from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.envs.multiplayer.referee import GameConfig, Referee
from roll_async.errors import ConfigError

_PILE = re.compile(r"Stones left: (\d+)\.")


@dataclass
class NimConfig(GameConfig):
    """Nim's settings: the range the starting pile is drawn from and the most stones one move takes."""

    #: Smallest starting pile.
    min_stones: int = 5
    #: Largest starting pile.
    max_stones: int = 15
    #: Most stones one move may take (a move takes 1..max_take, at most what is left).
    max_take: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.max_take) < 1:
            raise ConfigError(
                f"nim max_take must be >= 1, got {self.max_take}; a move takes 1..max_take stones"
            )
        if not 1 <= int(self.min_stones) <= int(self.max_stones):
            raise ConfigError(
                f"nim needs 1 <= min_stones <= max_stones, got min_stones={self.min_stones}, "
                f"max_stones={self.max_stones}; the starting pile is drawn from that range"
            )
        self.max_take = int(self.max_take)
        self.min_stones = int(self.min_stones)
        self.max_stones = int(self.max_stones)


def parse_pile(text: str) -> int:
    """The pile size in the last ``Stones left: N.`` of an observation (0 when there is none)."""
    found = _PILE.findall(text)
    return int(found[-1]) if found else 0


class Nim:
    """Two seats, one pile; see the module docstring for the rules."""

    num_players: int = 2
    config_cls = NimConfig

    def __init__(self, config: NimConfig | Mapping[str, Any] | None = None) -> None:
        self.config: NimConfig = build_config(NimConfig, config, "nim")
        self.referee = Referee("nim", self.num_players, self.config)
        self.seed: int | None = None
        self.pile = self.config.min_stones
        self.turn = 0

    def instruction(self, seat: int) -> str:
        take = self.config.max_take
        return (
            f"You are Player {seat} in Nim against one opponent; Player 0 moves first. A pile of stones lies "
            f"between you. Take turns removing 1 to {take} stones, never more than are left; whoever takes "
            "the last stone wins. An invalid move is told to you and you move again (at most "
            f"{self.config.error_allowance} times per turn); one more loses the game. Reply with the number "
            f"of stones you take inside the tags, for example {self.referee.wrap('1')}."
        )

    def reset(self, seed: int) -> None:
        """A new pile drawn from the seed: the same seed starts the same pile."""
        self.seed = int(seed)
        rng = random.Random(self.seed)
        self.pile = rng.randint(self.config.min_stones, self.config.max_stones)
        self.turn = 0
        self.referee.start()

    def legal_actions(self) -> tuple[str, ...]:
        return tuple(str(k) for k in range(1, min(self.config.max_take, self.pile) + 1))

    def get_observation(self) -> SeatObservation:
        self.referee.check_playing("get_observation")
        seat = self.turn
        legal = self.legal_actions()
        lines = self.referee.take_news(seat) + [
            f"You are Player {seat}. Stones left: {self.pile}.",
            f"Legal moves: {', '.join(legal)}.",
        ]
        return SeatObservation(seat, "\n".join(lines), legal)

    def step(self, action_text: str) -> TurnResult:
        self.referee.check_playing("step")
        seat = self.turn
        ruling = self.referee.judge(seat, action_text, self.legal_actions())
        if ruling.action is None:
            if ruling.forfeit:
                self.referee.forfeit(seat)
            return self.referee.invalid_turn(seat, ruling)
        taken = int(ruling.action)
        self.pile -= taken
        if self.pile == 0:
            self.referee.win(seat, f"Player {seat} took the last {taken} and wins.")
        else:
            self.referee.tell(
                f"Player {seat} took {taken}; {self.pile} left.", 1 - seat
            )
            self.turn = 1 - seat
        return TurnResult(seat, self.referee.done)

    def close(self) -> GameOutcome:
        return self.referee.outcome()

    def format_action(self, action: str) -> str:
        return self.referee.wrap(action)
