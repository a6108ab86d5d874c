"""Sliding puzzle (the 8- or 15-puzzle): put the tiles in order with the empty cell last.

A planning task with a solvable scramble and an exact solver, for multi-step
RL with a known optimum.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.errors import ConfigError, TaskGenerationError

MOVES: dict[str, tuple[int, int]] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}
_OPPOSITE = {"Up": "Down", "Down": "Up", "Left": "Right", "Right": "Left"}


@dataclass
class SlidingPuzzleConfig(EnvConfig):
    #: The board is size x size (3 is the 8-puzzle).
    size: int = 3
    #: Random legal moves applied to the solved board.
    num_scramble: int = 10
    step_penalty: float = -0.1
    success_reward: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.size = int(self.size)
        self.num_scramble = int(self.num_scramble)
        if self.size < 2:
            raise ConfigError(f"size must be >= 2, got {self.size}")
        if self.num_scramble < 1:
            raise ConfigError(
                f"num_scramble must be >= 1 (0 would start solved), got {self.num_scramble}"
            )


class SlidingPuzzleEnv(BaseEnv):
    """n x n sliding puzzle with an A* solver (Manhattan distance).

    The board is scrambled by ``num_scramble`` random legal moves from the solved
    state (never undoing the move just made), so it is solvable and needs at most
    ``num_scramble`` moves.

    Text render: one row per line, tiles right-aligned and separated by a space,
    the empty cell as ``_``; the solved 3x3 board is::

        1 2 3
        4 5 6
        7 8 _

    Actions move the empty cell: ``Up`` swaps it with the tile above it, and so on
    for ``Down``, ``Left``, ``Right``. A move off the board is valid but not
    effective.
    """

    config_cls: ClassVar[type] = SlidingPuzzleConfig
    action_words: ClassVar[tuple[str, ...]] = tuple(MOVES)

    def __init__(
        self, config: SlidingPuzzleConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: SlidingPuzzleConfig
        n = self.config.size
        self.goal = tuple(list(range(1, n * n)) + [0])
        self.board: list[int] = list(self.goal)

    def _reset(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = self.config.size
        for _ in range(100):
            self.board = list(self.goal)
            last = None
            for _ in range(self.config.num_scramble):
                options = [
                    m
                    for m in MOVES
                    if m != _OPPOSITE.get(last or "") and _slide(self.board, n, m)
                ]
                last = options[int(rng.integers(len(options)))]
                self.board = _slide(self.board, n, last)  # type: ignore[assignment]
            if tuple(self.board) != self.goal:
                return
        raise TaskGenerationError(
            f"scrambling kept returning the solved board (size={n}, num_scramble={self.config.num_scramble})"
        )

    def _apply(self, action: str) -> tuple[float, bool, str]:
        cfg = self.config
        moved = _slide(self.board, cfg.size, action)
        if moved is None:
            return cfg.step_penalty, False, ""
        self.board = moved
        if tuple(self.board) == self.goal:
            self.success = True
            self.done = True
            return cfg.step_penalty + cfg.success_reward, True, ""
        return cfg.step_penalty, True, ""

    def extra_metrics(self) -> dict[str, float | bool]:
        return {
            "tiles_in_place": float(
                sum(1 for a, b in zip(self.board, self.goal) if a == b and a != 0)
            )
        }

    def render_text(self) -> str:
        return format_board(self.board, self.config.size)

    def instruction(self) -> str:
        n = self.config.size
        goal = format_board(self.goal, n)
        return (
            f"You are solving a {n}x{n} sliding puzzle. Put the tiles in order, with the empty cell _ last:\n"
            f"{goal}\n"
            "Actions move the empty cell: Up, Down, Left, Right (Up swaps it with the tile above it).\n"
            f"Rewards: {self.config.step_penalty:g} per move, +{self.config.success_reward:g} when solved.\n"
            + self.answer_format("Left", "Up")
        )

    def solve(self, max_nodes: int = 200_000) -> list[str] | None:
        """A shortest move sequence from the current board (A* with Manhattan distance); None past max_nodes."""
        return solve_sliding(tuple(self.board), self.config.size, max_nodes)


def format_board(board: list[int] | tuple[int, ...], n: int) -> str:
    """Rows of right-aligned tiles, ``_`` for the empty cell."""
    width = len(str(n * n - 1))
    cells = [("_" if v == 0 else str(v)).rjust(width) for v in board]
    return "\n".join(" ".join(cells[r * n : (r + 1) * n]) for r in range(n))


def _slide(board: list[int] | tuple[int, ...], n: int, move: str) -> list[int] | None:
    """The board after moving the empty cell, or None when the move leaves the board."""
    i = list(board).index(0)
    r, c = divmod(i, n)
    dr, dc = MOVES[move]
    rr, cc = r + dr, c + dc
    if not (0 <= rr < n and 0 <= cc < n):
        return None
    out = list(board)
    j = rr * n + cc
    out[i], out[j] = out[j], 0
    return out


def solve_sliding(
    board: tuple[int, ...], n: int, max_nodes: int = 200_000
) -> list[str] | None:
    """A* over boards; Manhattan distance is admissible, so the first goal popped is optimal."""
    goal = tuple(list(range(1, n * n)) + [0])

    def h(b: tuple[int, ...]) -> int:
        return sum(
            abs(i // n - (v - 1) // n) + abs(i % n - (v - 1) % n)
            for i, v in enumerate(b)
            if v
        )

    best = {board: 0}
    parent: dict[tuple[int, ...], tuple[tuple[int, ...], str] | None] = {board: None}
    heap = [(h(board), 0, board)]
    expanded = 0
    while heap:
        _, g, b = heapq.heappop(heap)
        if b == goal:
            path = []
            while parent[b] is not None:
                b, m = parent[b]  # type: ignore[misc]
                path.append(m)
            return path[::-1]
        if g > best.get(b, g):
            continue
        expanded += 1
        if expanded > max_nodes:
            return None
        for m in MOVES:
            nb = _slide(b, n, m)
            if nb is None:
                continue
            t = tuple(nb)
            if g + 1 < best.get(t, 1 << 30):
                best[t] = g + 1
                parent[t] = (b, m)
                heapq.heappush(heap, (g + 1 + h(t), g + 1, t))
    return None
