"""Sokoban: push every box onto a target in a procedurally generated room.

The classic agentic RL benchmark (RAGEN, VAGEN), built in with text and vision
renders, rooms solvable by construction and a solver for expert turns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.envs.render import draw_grid
from roll_async.errors import ConfigError, TaskGenerationError

Pos = tuple[int, int]
MOVES: dict[str, Pos] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}
_MASKS = [
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
]
_STYLES = {
    "#": ((70, 50, 40), None, (0, 0, 0)),
    "_": ((235, 230, 215), None, (0, 0, 0)),
    "O": ((235, 230, 215), "ring", (210, 40, 40)),
    "X": ((235, 230, 215), "square", (235, 150, 40)),
    "*": ((235, 230, 215), "square", (60, 170, 70)),
    "P": ((235, 230, 215), "circle", (40, 90, 220)),
    "S": ((250, 200, 200), "circle", (40, 90, 220)),
}


@dataclass
class SokobanConfig(EnvConfig):
    #: Room size (rows, columns) including the outer wall.
    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    #: Length of the reverse-play walk that scatters the boxes; longer walks give harder rooms.
    search_depth: int = 30
    step_penalty: float = -0.1
    box_on_target_reward: float = 1.0
    success_reward: float = 10.0
    #: Pixels per cell in vision mode.
    image_cell_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        dim = tuple(int(d) for d in self.dim_room)
        if len(dim) != 2 or min(dim) < 4:
            raise ConfigError(
                f"dim_room must be two sizes >= 4 (the border is wall), got {self.dim_room}"
            )
        self.dim_room = dim
        self.num_boxes = int(self.num_boxes)
        interior = (dim[0] - 2) * (dim[1] - 2)
        most = max(0, interior // 3)
        if self.num_boxes < 1:
            raise ConfigError(f"num_boxes must be >= 1, got {self.num_boxes}")
        if self.num_boxes > most:
            raise ConfigError(
                f"num_boxes={self.num_boxes} does not fit in dim_room={list(dim)}: "
                f"at most {most} boxes fit ({interior} inner cells, a third of them)"
            )
        if int(self.search_depth) < 1:
            raise ConfigError(f"search_depth must be >= 1, got {self.search_depth}")
        self.search_depth = int(self.search_depth)


class SokobanEnv(BaseEnv):
    """Sokoban with reverse-play room generation and a BFS solver.

    Rooms are solvable by construction: a random room topology is carved, boxes are
    placed on their targets, and the player then plays *backwards* from that solved
    state (moving and pulling boxes) for ``search_depth`` moves; every pull undone
    is a legal push, so the state reached can be pushed back to the solved one. Of
    the states visited, the one whose boxes lie farthest from their targets is kept.

    Text render, one row per line (``dim_room`` rows by columns, border included)::

        #  wall            _  floor
        O  target          X  box           *  box on a target
        P  player          S  player standing on a target

    Vision render: the same grid drawn as coloured cells (dark wall, light floor,
    red ring target, orange box, green box on target, blue player).

    Actions: ``Up``, ``Down``, ``Left``, ``Right`` (Up moves toward the first row).
    """

    config_cls: ClassVar[type] = SokobanConfig
    action_words: ClassVar[tuple[str, ...]] = tuple(MOVES)
    render_modes: ClassVar[tuple[str, ...]] = ("text", "vision")

    def __init__(
        self, config: SokobanConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: SokobanConfig
        self.walls: frozenset[Pos] = frozenset()
        self.targets: frozenset[Pos] = frozenset()
        self.boxes: set[Pos] = set()
        self.player: Pos = (0, 0)

    # ---- generation -------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        cfg = self.config
        for _ in range(100):
            room = _generate_room(rng, cfg.dim_room, cfg.num_boxes, cfg.search_depth)
            if room is not None:
                self.walls, self.targets, boxes, self.player = room
                self.boxes = set(boxes)
                return
        raise TaskGenerationError(
            f"could not generate a Sokoban room with dim_room={list(cfg.dim_room)}, num_boxes={cfg.num_boxes}, "
            f"search_depth={cfg.search_depth} for seed {seed}; use a larger room or fewer boxes"
        )

    # ---- dynamics ---------------------------------------------------------------
    def _apply(self, action: str) -> tuple[float, bool, str]:
        cfg = self.config
        dr, dc = MOVES[action]
        reward = cfg.step_penalty
        nxt = (self.player[0] + dr, self.player[1] + dc)
        if nxt in self.walls:
            return reward, False, ""
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return reward, False, ""
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            reward += cfg.box_on_target_reward * (
                (beyond in self.targets) - (nxt in self.targets)
            )
        self.player = nxt
        if self.boxes <= self.targets:
            self.success = True
            self.done = True
            reward += cfg.success_reward
        return reward, True, ""

    def extra_metrics(self) -> dict[str, float | bool]:
        return {"boxes_on_target": float(len(self.boxes & self.targets))}

    # ---- renders ----------------------------------------------------------------
    def grid(self) -> list[list[str]]:
        rows, cols = self.config.dim_room
        out = []
        for r in range(rows):
            row = []
            for c in range(cols):
                p = (r, c)
                if p in self.walls:
                    row.append("#")
                elif p in self.boxes:
                    row.append("*" if p in self.targets else "X")
                elif p == self.player:
                    row.append("S" if p in self.targets else "P")
                else:
                    row.append("O" if p in self.targets else "_")
            out.append(row)
        return out

    def render_text(self) -> str:
        return "\n".join("".join(row) for row in self.grid())

    def render_image(self) -> Image.Image:
        return draw_grid(self.grid(), _STYLES, self.config.image_cell_size)

    def instruction(self) -> str:
        if self.config.render_mode == "vision":
            legend = (
                "The image shows the room: dark brown cells are walls, light cells are floor, red rings are "
                "targets, orange squares are boxes, green squares are boxes on targets, the blue circle is you."
            )
        else:
            legend = "Symbols: # wall, _ floor, O target, X box, * box on a target, P player, S player on a target."
        return (
            "You are playing Sokoban. Push every box onto a target. You push a box by walking into it; "
            "you cannot pull boxes, push two boxes at once, or push a box into a wall.\n"
            f"{legend}\n"
            "Actions: Up, Down, Left, Right (Up moves toward the top row).\n"
            f"Rewards: {self.config.step_penalty:g} per move, +{self.config.box_on_target_reward:g} for a box pushed "
            f"onto a target, +{self.config.success_reward:g} when all boxes are on targets.\n"
            + self.answer_format("Up", "Left")
        )

    # ---- solver -----------------------------------------------------------------
    def solve(self, max_states: int = 200_000) -> list[str] | None:
        """Shortest move sequence from the current state (BFS over player and box positions)."""
        return solve_sokoban(
            self.walls, self.targets, frozenset(self.boxes), self.player, max_states
        )


def _generate_room(
    rng: np.random.Generator,
    dim: tuple[int, int],
    num_boxes: int,
    search_depth: int,
    max_states: int = 20_000,
) -> tuple[frozenset[Pos], frozenset[Pos], frozenset[Pos], Pos] | None:
    """One attempt: carve a room, put the boxes on their targets, search backwards; None if nothing moved."""
    rows, cols = dim
    names = list(MOVES)
    floor = np.zeros(dim, dtype=bool)
    r, c = int(rng.integers(1, rows - 1)), int(rng.integers(1, cols - 1))
    d = MOVES[names[int(rng.integers(4))]]
    for _ in range(int(1.5 * (rows + cols))):
        if rng.random() < 0.35:
            d = MOVES[names[int(rng.integers(4))]]
        r = min(max(r + d[0], 1), rows - 2)
        c = min(max(c + d[1], 1), cols - 2)
        mask = np.array(_MASKS[int(rng.integers(len(_MASKS)))], dtype=bool)
        floor[r - 1 : r + 2, c - 1 : c + 2] |= mask
    floor[0, :] = floor[-1, :] = floor[:, 0] = floor[:, -1] = False
    cells = [(int(i), int(j)) for i, j in np.argwhere(floor)]
    if len(cells) < num_boxes + 2:
        return None
    pick = rng.permutation(len(cells))
    targets = frozenset(cells[i] for i in pick[:num_boxes])
    walls = frozenset(
        (i, j) for i in range(rows) for j in range(cols) if not floor[i, j]
    )

    # Reverse BFS from every solved state: a step moves the player and may pull the box behind it
    # (an undone push). The BFS depth of a state is exactly its forward optimal solution length.
    level = [(p, targets) for p in cells if p not in targets]
    seen = set(level)
    deepest: list[tuple[Pos, frozenset[Pos]]] = []
    for _ in range(search_depth):
        nxt_level = []
        for player, boxes in level:
            for dr, dc in MOVES.values():
                nxt = (player[0] + dr, player[1] + dc)
                if nxt in walls or nxt in boxes:
                    continue
                succ = [(nxt, boxes)]
                behind = (player[0] - dr, player[1] - dc)
                if behind in boxes:
                    succ.append((nxt, (boxes - {behind}) | {player}))
                for s in succ:
                    if s not in seen:
                        seen.add(s)
                        nxt_level.append(s)
        if not nxt_level:
            break
        deepest = level = nxt_level
        if len(seen) >= max_states:
            break
    if not deepest:
        return None
    choice = deepest[int(rng.integers(len(deepest)))]
    return walls, targets, choice[1], choice[0]


def solve_sokoban(
    walls: frozenset[Pos],
    targets: frozenset[Pos],
    boxes: frozenset[Pos],
    player: Pos,
    max_states: int = 200_000,
) -> list[str] | None:
    """BFS over (player, boxes); prunes boxes pushed into a non-target corner. None if unsolved within max_states."""
    if boxes <= targets:
        return []

    def dead(p: Pos) -> bool:
        if p in targets:
            return False
        up, down = (p[0] - 1, p[1]) in walls, (p[0] + 1, p[1]) in walls
        left, right = (p[0], p[1] - 1) in walls, (p[0], p[1] + 1) in walls
        return (up or down) and (left or right)

    start = (player, boxes)
    parent: dict[
        tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None
    ] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pl, bx = state
        for name, (dr, dc) in MOVES.items():
            nxt = (pl[0] + dr, pl[1] + dc)
            if nxt in walls:
                continue
            nb = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bx or dead(beyond):
                    continue
                nb = (bx - {nxt}) | {beyond}
            new = (nxt, nb)
            if new in parent:
                continue
            parent[new] = (state, name)
            if nb <= targets:
                path = []
                step = parent[new]
                while step is not None:
                    cur, move = step
                    path.append(move)
                    step = parent[cur]
                return path[::-1]
            if len(parent) >= max_states:
                return None
            queue.append(new)
    return None
