"""Sokoban: generation guarantees, reward semantics, multi-action turns, solver, bad parameters."""

from __future__ import annotations

import pytest

from roll_async.envs import SokobanEnv, make_env
from roll_async.envs.sokoban import solve_sokoban


def corridor(env: SokobanEnv, boxes, targets, player, extra_floor=()) -> None:
    """Replace the generated room by a hand-made one: floor on row 1, columns 1-4 (plus extra_floor)."""
    floor = {(1, c) for c in range(1, 5)} | set(extra_floor)
    rows, cols = env.config.dim_room
    env.walls = frozenset(
        (r, c) for r in range(rows) for c in range(cols) if (r, c) not in floor
    )
    env.boxes, env.targets, env.player = set(boxes), frozenset(targets), player


def act(env, word):
    return env.step(f"<answer>{word}</answer>")


def test_rewards_follow_the_docstring():
    env = SokobanEnv()
    env.reset(0)
    # The second box sits off its target in an unreachable row, so the episode cannot end early.
    corridor(
        env,
        boxes=[(1, 2), (3, 2)],
        targets=[(1, 3), (3, 4)],
        player=(1, 1),
        extra_floor=[(3, c) for c in range(1, 5)],
    )
    assert env.render_text().splitlines()[1] == "#PXO_#"
    obs, r, term, _, info = act(env, "Left")  # into the wall
    assert (
        r == pytest.approx(-0.1)
        and info["metrics"]["action_is_effective"] is False
        and not term
    )
    obs, r, _, _, info = act(env, "Right")  # box onto target
    assert r == pytest.approx(0.9) and info["metrics"]["boxes_on_target"] == 1.0
    assert obs.splitlines()[1] == "#_P*_#"
    _, r, _, _, info = act(env, "Right")  # box off target
    assert r == pytest.approx(-1.1) and info["metrics"]["boxes_on_target"] == 0.0
    obs, r, _, _, info = act(env, "Right")  # box against the wall cannot move
    assert r == pytest.approx(-0.1) and info["metrics"]["action_is_effective"] is False
    assert obs.splitlines()[1] == "#__SX#"  # player on the (now empty) target


def test_success_reward_ends_episode():
    env = SokobanEnv()
    env.reset(0)
    corridor(env, boxes=[(1, 2)], targets=[(1, 3)], player=(1, 1))
    _, r, term, trunc, info = act(env, "Right")
    assert (
        r == pytest.approx(-0.1 + 1 + 10)
        and term
        and not trunc
        and info["metrics"]["success"] is True
    )


def test_two_boxes_in_a_row_cannot_be_pushed():
    env = SokobanEnv()
    env.reset(0)
    corridor(
        env,
        boxes=[(1, 2), (1, 3)],
        targets=[(1, 4), (3, 3)],
        player=(1, 1),
        extra_floor=[(3, 3)],
    )
    *_, info = act(env, "Right")
    assert env.player == (1, 1) and info["metrics"]["action_is_effective"] is False


@pytest.mark.parametrize(
    "cfg", [{}, {"dim_room": [7, 8], "num_boxes": 2, "search_depth": 40}]
)
def test_generated_rooms_are_walled_unsolved_and_solvable(cfg):
    env = SokobanEnv(cfg)
    rows, cols = env.config.dim_room
    for seed in range(10):
        env.reset(seed)
        border = {
            (r, c)
            for r in range(rows)
            for c in range(cols)
            if r in (0, rows - 1) or c in (0, cols - 1)
        }
        assert border <= env.walls
        assert len(env.boxes) == len(env.targets) == env.config.num_boxes
        assert not env.boxes <= env.targets and env.player not in env.boxes | env.walls
        plan = env.solve()
        assert plan and len(plan) <= env.config.search_depth


def test_search_depth_sets_optimal_solution_length():
    """Reverse BFS depth is the forward optimal length, so small search depths give exactly that many moves."""
    env = SokobanEnv(search_depth=3)
    lengths = []
    for seed in range(10):
        env.reset(seed)
        lengths.append(len(env.solve()))
    assert max(lengths) == 3 and all(1 <= n <= 3 for n in lengths)


def test_several_actions_per_turn_and_dropping_extras():
    env = SokobanEnv(max_actions_per_turn=2)
    env.reset(0)
    corridor(
        env,
        boxes=[(3, 3)],
        targets=[(3, 4)],
        player=(1, 1),
        extra_floor=[(3, 3), (3, 4)],
    )
    _, r, _, _, info = env.step("<answer>Right, right, Right</answer>")
    assert env.player == (1, 3) and info["actions"] == ["Right", "Right"]
    assert (
        info["metrics"]["num_actions_dropped"] == 1.0
        and info["metrics"]["action_is_valid"] is True
    )
    assert r == pytest.approx(-0.2)
    # The valid prefix still runs; the bad word costs the format penalty once.
    _, r, _, _, info = env.step("<answer>Left, Jump</answer>")
    assert env.player == (1, 2) and info["metrics"]["action_is_valid"] is False
    assert r == pytest.approx(-0.1 - 0.1) and "Jump" in info["format_error"]


def test_instruction_documents_legend_and_multi_action_format():
    _, info = SokobanEnv(max_actions_per_turn=3).reset(0)
    text = info["instruction"]
    assert "# wall" in text and "X box" in text and "<answer>Up</answer>" in text
    assert "up to 3 actions" in text and "<answer>Up, Left</answer>" in text


def test_solver_returns_none_for_an_impossible_room():
    walls = frozenset(
        {(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)}
    )
    # Box in a corner that is not a target: no push can ever move it.
    assert (
        solve_sokoban(walls, frozenset({(1, 2)}), frozenset({(1, 1)}), (1, 2)) is None
    )


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"dim_room": [3, 3]}, "dim_room"),
        ({"dim_room": [6, 6], "num_boxes": 9}, "num_boxes=9 does not fit"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"search_depth": 0}, "search_depth"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_impossible_parameters_fail_at_construction(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_env("sokoban", cfg)
