"""FrozenLake: walk from the top-left start to the goal in the bottom-right corner without falling into a hole.

A small grid task with text and vision renders and an exact expert, with
gymnasium's map generation and slippery dynamics, built in so the offline demo
needs no extra library.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.envs.render import draw_grid
from roll_async.errors import ConfigError

Pos = tuple[int, int]
MOVES: dict[str, Pos] = {
    "Left": (0, -1),
    "Down": (1, 0),
    "Right": (0, 1),
    "Up": (-1, 0),
}
#: Perpendicular slips for each intended move (gymnasium: action-1, action, action+1 mod 4).
_SLIPS = {
    "Left": ("Up", "Left", "Down"),
    "Down": ("Left", "Down", "Right"),
    "Right": ("Down", "Right", "Up"),
    "Up": ("Right", "Up", "Left"),
}
_STYLES = {
    "_": ((200, 230, 250), None, (0, 0, 0)),
    "O": ((20, 40, 110), None, (0, 0, 0)),
    "G": ((240, 200, 60), None, (0, 0, 0)),
    "P": ((200, 230, 250), "circle", (220, 40, 40)),
    "X": ((20, 40, 110), "cross", (0, 0, 0)),
    "*": ((240, 200, 60), "circle", (220, 40, 40)),
}


@dataclass
class FrozenLakeConfig(EnvConfig):
    #: The map is size x size.
    size: int = 4
    #: Probability that a tile is frozen (walkable).
    p: float = 0.8
    is_slippery: bool = False
    success_reward: float = 1.0
    #: Pixels per cell in vision mode.
    image_cell_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        self.size = int(self.size)
        self.p = float(self.p)
        if self.size < 2:
            raise ConfigError(
                f"size must be >= 2 (a 1x1 lake has the start on the goal), got {self.size}"
            )
        if not 0.0 < self.p <= 1.0:
            raise ConfigError(f"p (frozen probability) must be in (0, 1], got {self.p}")


class FrozenLakeEnv(BaseEnv):
    """FrozenLake with a path-guaranteeing map generator, a BFS planner and a value-iteration expert.

    Maps follow gymnasium's ``generate_random_map``: each tile is frozen with
    probability ``p`` and a hole otherwise, redrawn until a path from start to
    goal exists. Where ``p`` is so low that redrawing keeps failing, a random
    monotone path is thawed into the last draw, so every map has a path.
    ``is_slippery`` uses gymnasium's dynamics: the move goes the intended way or
    to either side of it, each with probability 1/3.

    Text render, one row per line::

        _  frozen tile     O  hole          G  goal
        P  player          X  player in a hole     *  player on the goal

    Vision render: light blue ice, dark blue holes, a gold goal, a red circle for
    the player (a black cross when it fell in).

    Actions: ``Left``, ``Down``, ``Right``, ``Up``.
    """

    config_cls: ClassVar[type] = FrozenLakeConfig
    action_words: ClassVar[tuple[str, ...]] = tuple(MOVES)
    render_modes: ClassVar[tuple[str, ...]] = ("text", "vision")

    def __init__(
        self, config: FrozenLakeConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: FrozenLakeConfig
        self.desc: list[str] = []
        self.player: Pos = (0, 0)
        self.rng = np.random.default_rng(0)
        self.fell = False

    def _reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.desc = generate_map(self.rng, self.config.size, self.config.p)
        self.player = (0, 0)
        self.fell = False
        self._policy: dict[Pos, str] | None = None

    def _apply(self, action: str) -> tuple[float, bool, str]:
        move = action
        if self.config.is_slippery:
            move = _SLIPS[action][int(self.rng.integers(3))]
        n = self.config.size
        dr, dc = MOVES[move]
        r = min(max(self.player[0] + dr, 0), n - 1)
        c = min(max(self.player[1] + dc, 0), n - 1)
        changed = (r, c) != self.player
        self.player = (r, c)
        tile = self.desc[r][c]
        if tile == "H":
            self.fell = True
            self.done = True
            return 0.0, changed, "You fell into a hole."
        if tile == "G":
            self.success = True
            self.done = True
            return self.config.success_reward, changed, ""
        note = f"You slipped and moved {move}." if move != action else ""
        return 0.0, changed, note

    def extra_metrics(self) -> dict[str, float | bool]:
        return {"fell_in_hole": self.fell}

    def grid(self) -> list[list[str]]:
        out = []
        for r, row in enumerate(self.desc):
            cells = []
            for c, tile in enumerate(row):
                if (r, c) == self.player:
                    cells.append({"H": "X", "G": "*"}.get(tile, "P"))
                else:
                    cells.append({"H": "O", "G": "G"}.get(tile, "_"))
            out.append(cells)
        return out

    def render_text(self) -> str:
        return "\n".join("".join(row) for row in self.grid())

    def render_image(self) -> Image.Image:
        return draw_grid(self.grid(), _STYLES, self.config.image_cell_size)

    def instruction(self) -> str:
        if self.config.render_mode == "vision":
            legend = (
                "The image shows the lake: light blue cells are frozen, dark blue cells are holes, the gold cell "
                "is the goal, the red circle is you."
            )
        else:
            legend = "Symbols: _ frozen tile, O hole, G goal, P player, X player in a hole, * player on the goal."
        slip = (
            " The ice is slippery: a move may go sideways instead (each way with probability 1/3)."
            if self.config.is_slippery
            else ""
        )
        return (
            "You are playing FrozenLake. Walk from your position to the goal without stepping into a hole."
            f"{slip}\n{legend}\n"
            "Actions: Left, Down, Right, Up (Up moves toward the top row).\n"
            f"Rewards: +{self.config.success_reward:g} for reaching the goal, 0 otherwise; a hole ends the game.\n"
            + self.answer_format("Right", "Down")
        )

    def solve(self) -> list[str] | None:
        """Shortest safe path from the current tile, ignoring slipperiness (exact when not slippery)."""
        return shortest_path(self.desc, self.player)

    def expert_action(self) -> str:
        """The move with the highest chance of reaching the goal from here (value iteration; exact when slippery)."""
        if self._policy is None:
            self._policy = optimal_policy(self.desc, self.config.is_slippery)
        return self._policy[self.player]


def generate_map(
    rng: np.random.Generator, size: int, p: float, max_tries: int = 100
) -> list[str]:
    """Rows of 'S', 'F', 'H', 'G' with a start-to-goal path (gymnasium's rejection sampling, then a thawed path)."""
    board = None
    for _ in range(max_tries):
        board = rng.choice(np.array(["F", "H"]), (size, size), p=[p, 1 - p])
        board[0][0], board[-1][-1] = "S", "G"
        if shortest_path(["".join(r) for r in board], (0, 0)) is not None:
            return ["".join(r) for r in board]
    # Thaw a random monotone path (rights and downs in random order) through the last draw.
    steps = ["Right"] * (size - 1) + ["Down"] * (size - 1)
    rng.shuffle(steps)
    assert board is not None  # max_tries >= 1
    r = c = 0
    for s in steps:
        r, c = r + MOVES[s][0], c + MOVES[s][1]
        if board[r][c] == "H":
            board[r][c] = "F"
    return ["".join(row) for row in board]


def shortest_path(desc: list[str], start: Pos) -> list[str] | None:
    """BFS over frozen tiles from ``start`` to the goal; None when no path exists."""
    n = len(desc)
    parent: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if desc[pos[0]][pos[1]] == "G":
            path = []
            step = parent[pos]
            while step is not None:
                pos, move = step
                path.append(move)
                step = parent[pos]
            return path[::-1]
        if desc[pos[0]][pos[1]] == "H":
            continue
        for name, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if (
                0 <= nxt[0] < n
                and 0 <= nxt[1] < n
                and nxt not in parent
                and desc[nxt[0]][nxt[1]] != "H"
            ):
                parent[nxt] = (pos, name)
                queue.append(nxt)
    return None


def optimal_policy(
    desc: list[str], slippery: bool, iters: int = 1000
) -> dict[Pos, str]:
    """Value iteration for the chance of reaching the goal; discount 0.99 makes ties prefer the shorter way."""
    n = len(desc)
    tiles = np.array([list(row) for row in desc]).reshape(-1)
    goal, hole = tiles == "G", tiles == "H"
    names = list(MOVES)
    # nxt[a, k, s]: where outcome k of action a lands from state s.
    nxt = np.zeros((4, 3 if slippery else 1, n * n), dtype=np.int64)
    for ai, a in enumerate(names):
        for k, m in enumerate(_SLIPS[a] if slippery else (a,)):
            dr, dc = MOVES[m]
            for s in range(n * n):
                r, c = divmod(s, n)
                nxt[ai, k, s] = min(max(r + dr, 0), n - 1) * n + min(
                    max(c + dc, 0), n - 1
                )
    value = np.zeros(n * n)
    live = ~(goal | hole)
    for _ in range(iters):
        q = np.where(goal[nxt], 1.0, np.where(hole[nxt], 0.0, 0.99 * value[nxt])).mean(
            axis=1
        )
        new = np.where(live, q.max(axis=0), 0.0)
        done = np.max(np.abs(new - value)) < 1e-9
        value = new
        if done:
            break
    q = np.where(goal[nxt], 1.0, np.where(hole[nxt], 0.0, 0.99 * value[nxt])).mean(
        axis=1
    )
    best = q.argmax(axis=0)
    return {divmod(s, n): names[int(best[s])] for s in range(n * n)}
