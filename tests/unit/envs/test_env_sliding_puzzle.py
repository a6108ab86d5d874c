"""Sliding puzzle: scrambles are legal and bounded, move semantics, rewards, optimal solver."""

from __future__ import annotations

import pytest

from roll_async.envs import SlidingPuzzleEnv, make_env


def act(env, word):
    return env.step(f"<answer>{word}</answer>")


def test_render_and_move_semantics():
    env = SlidingPuzzleEnv()
    env.reset(0)
    env.board = [1, 2, 3, 4, 5, 6, 7, 0, 8]
    assert env.render_text() == "1 2 3\n4 5 6\n7 _ 8"
    obs, r, _, _, info = act(env, "Up")  # the empty cell swaps with the 5 above it
    assert (
        obs == "1 2 3\n4 _ 6\n7 5 8"
        and r == pytest.approx(-0.1)
        and info["metrics"]["action_is_effective"]
    )
    act(env, "Down")
    _, r, _, _, info = act(env, "Down")  # off the board
    assert r == pytest.approx(-0.1) and info["metrics"]["action_is_effective"] is False
    _, r, term, _, info = act(env, "Right")
    assert r == pytest.approx(-0.1 + 10) and term and info["metrics"]["success"] is True
    assert info["metrics"]["tiles_in_place"] == 8.0


def test_scrambles_are_unsolved_and_solver_is_optimal_within_scramble_length():
    env = SlidingPuzzleEnv(size=3, num_scramble=12)
    for seed in range(10):
        env.reset(seed)
        assert tuple(env.board) != env.goal and sorted(env.board) == list(range(9))
        plan = env.solve()
        # parity: each move swaps the blank's colour
        assert 1 <= len(plan) <= 12 and len(plan) % 2 == 0


def test_four_by_four_renders_aligned_and_solves():
    env = SlidingPuzzleEnv(size=4, num_scramble=16, max_steps=40)
    obs, info = env.reset(1)
    # four cells of width 2 plus spaces
    assert all(len(line) == 11 for line in obs.splitlines())
    assert "13 14 15  _" in info["instruction"]
    for word in env.solve():
        act(env, word)
    assert env.success


@pytest.mark.parametrize(
    "cfg, message", [({"size": 1}, "size"), ({"num_scramble": 0}, "num_scramble")]
)
def test_impossible_parameters_fail_at_construction(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_env("sliding_puzzle", cfg)
