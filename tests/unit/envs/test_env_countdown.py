"""Countdown: the safe expression parser, number usage, reward semantics, generator and solver."""

from __future__ import annotations

from fractions import Fraction

import pytest

from roll_async.envs import CountdownEnv, make_env
from roll_async.envs.countdown import parse_expression


@pytest.mark.parametrize(
    "expr, value, used",
    [
        ("1 + 2 * 3", 7, [1, 2, 3]),
        ("(1 + 2) * 3", 9, [1, 2, 3]),
        ("8 / 3 * 3", 8, [8, 3, 3]),
        ("10 - 4 - 3", 3, [10, 4, 3]),
        ("(3 + 5) x 2 = 16", 16, [3, 5, 2]),
        ("6 ÷ 4", Fraction(3, 2), [6, 4]),
    ],
)
def test_parser_values(expr, value, used):
    assert parse_expression(expr) == (Fraction(value), used)


@pytest.mark.parametrize(
    "expr",
    [
        "2 ** 3",
        "__import__('os').system('true')",
        "(1 + 2",
        "1 +",
        "5 / (2 - 2)",
        "",
        "1.5 + 2",
        "-3 + 4",
    ],
)
def test_parser_rejects_everything_else(expr):
    with pytest.raises(ValueError):
        parse_expression(expr)


def task(env: CountdownEnv, numbers, target) -> None:
    env.reset(0)
    env.numbers, env.target = list(numbers), target


def test_rewards_wrong_then_right():
    env = CountdownEnv()
    task(env, [3, 5, 2, 7], 16)
    obs, r, term, _, info = env.step("<answer>3 + 5</answer>")
    assert (r, term) == (0.0, False) and info["metrics"]["action_is_valid"] is True
    assert info["metrics"]["action_is_effective"] is False and "equals 8, not 16" in obs
    obs, r, term, _, info = env.step("<answer>(3 + 5) * 2</answer>")
    assert (r, term, info["metrics"]["success"]) == (1.0, True, True)


def test_numbers_may_be_used_at_most_once():
    env = CountdownEnv()
    task(env, [4, 4, 1, 9], 16)
    _, r, _, _, info = env.step("<answer>4 * 4</answer>")  # 4 is given twice
    assert r == 1.0
    task(env, [4, 3, 1, 9], 16)
    _, r, _, _, info = env.step("<answer>4 * 4</answer>")
    assert r == pytest.approx(-0.1) and info["metrics"]["action_is_valid"] is False
    assert "not available: [4]" in info["format_error"]


def test_generated_targets_are_reachable_and_in_range():
    env = CountdownEnv(num_numbers=4, max_number=25, max_target=100)
    for seed in range(20):
        env.reset(seed)
        assert len(env.numbers) == 4 and all(1 <= n <= 25 for n in env.numbers)
        assert 1 <= env.target <= 100
        (expr,) = env.solve()
        value, used = parse_expression(expr)
        assert value == env.target and not (set(used) - set(env.numbers))


def test_whole_answer_is_one_action_even_with_commas():
    env = CountdownEnv()
    task(env, [1, 2], 3)
    _, _, _, _, info = env.step("<answer>1, 2</answer>")
    assert (
        info["metrics"]["action_is_valid"] is False
        and "invalid expression" in info["format_error"]
    )


@pytest.mark.parametrize(
    "cfg, message",
    [({"num_numbers": 1}, "num_numbers"), ({"max_number": 1}, "max_number")],
)
def test_impossible_parameters_fail_at_construction(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_env("countdown", cfg)
