"""Tic-tac-toe for two seats: a full-information game written here, so seat play is tested offline.

Seat 0 plays X and moves first, seat 1 plays O. A move names an empty cell 0-8 (row by
row) in the configured tag, ``<answer>4</answer>`` by default. Three in a row wins
(+1 / -1), a full board draws (0 / 0). An invalid move (no tag, not a cell, a taken cell)
is told to its seat, which moves again up to ``error_allowance`` times in that turn; one
more forfeits: the invalid mover loses (-1 / +1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from roll_async.envs.base import build_config
from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.envs.multiplayer.referee import GameConfig, Referee

MARKS = ("X", "O")
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2),
    (3, 4, 5),
    (6, 7, 8),
    (0, 3, 6),
    (1, 4, 7),
    (2, 5, 8),
    (0, 4, 8),
    (2, 4, 6),
)
_ROW = re.compile(r"^ (\S) \| (\S) \| (\S)$", re.MULTILINE)


def render_board(cells: list[str]) -> str:
    """The board as text: a mark where there is one, the cell's number where it is empty."""
    shown = [c or str(i) for i, c in enumerate(cells)]
    rows = [" " + " | ".join(shown[r * 3 : r * 3 + 3]) for r in range(3)]
    return "\n---+---+---\n".join(rows)


def parse_board(text: str) -> list[str]:
    """The cells of the last board in ``text`` ('' for empty), as :func:`render_board` writes it."""
    rows = _ROW.findall(text)[-3:]
    if len(rows) < 3:
        return [""] * 9
    return [c if c in MARKS else "" for row in rows for c in row]


def winner(cells: list[str]) -> str:
    """The mark with three in a row, or ''."""
    for a, b, c in LINES:
        if cells[a] and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return ""


class TicTacToe:
    """Two seats, X (seat 0, first) and O (seat 1); see the module docstring for the rules."""

    num_players: int = 2
    config_cls = GameConfig

    def __init__(self, config: GameConfig | Mapping[str, Any] | None = None) -> None:
        self.config: GameConfig = build_config(GameConfig, config, "tic_tac_toe")
        self.referee = Referee("tic_tac_toe", self.num_players, self.config)
        self.cells: list[str] = [""] * 9
        self.turn = 0
        self.seed: int | None = None

    def instruction(self, seat: int) -> str:
        mark, other = MARKS[seat], MARKS[1 - seat]
        return (
            f"You are Player {seat} in tic-tac-toe: you play {mark}, your opponent plays {other}; X moves first. "
            "Cells are numbered 0-8, row by row. Take turns marking one empty cell; three of your marks in a "
            "row, column or diagonal wins, a full board is a draw. An invalid move is told to you and you move "
            f"again (at most {self.config.error_allowance} times per turn); one more loses the game. "
            f"Reply with the cell inside the tags, for example {self.referee.wrap('4')}."
        )

    def reset(self, seed: int) -> None:
        """A new empty board; nothing in tic-tac-toe is random, so the seed only names the game."""
        self.seed = int(seed)
        self.cells = [""] * 9
        self.turn = 0
        self.referee.start()

    def legal_actions(self) -> tuple[str, ...]:
        return tuple(str(i) for i, c in enumerate(self.cells) if not c)

    def get_observation(self) -> SeatObservation:
        self.referee.check_playing("get_observation")
        seat = self.turn
        legal = self.legal_actions()
        lines = self.referee.take_news(seat) + [
            f"You are Player {seat} ({MARKS[seat]}). Board:",
            render_board(self.cells),
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
        cell = int(ruling.action)
        self.cells[cell] = MARKS[seat]
        self.referee.tell(f"Player {seat} ({MARKS[seat]}) took cell {cell}.", 1 - seat)
        if winner(self.cells):
            self.referee.win(
                seat, f"Player {seat} ({MARKS[seat]}) has three in a row and wins."
            )
        elif all(self.cells):
            self.referee.finish([0.0, 0.0], "The board is full: a draw.")
        else:
            self.turn = 1 - seat
        return TurnResult(seat, self.referee.done)

    def close(self) -> GameOutcome:
        return self.referee.outcome()

    def format_action(self, action: str) -> str:
        return self.referee.wrap(action)
