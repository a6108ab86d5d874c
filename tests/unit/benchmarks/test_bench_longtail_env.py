"""LongTailEnv, the benchmark workload with long-tailed turn counts and step latencies."""

from __future__ import annotations

import time

import pytest

from roll_async.envs import make_env, registered_envs
from roll_async.envs.longtail import pareto_turns


def play(env, seed: int, actions=lambda turn: f"action {turn}") -> list[tuple]:
    env.reset(seed)
    steps = []
    for turn in range(100):
        _, reward, terminated, truncated, info = env.step(actions(turn))
        steps.append((reward, terminated, info["metrics"]["step_latency_s"]))
        if terminated or truncated:
            return steps
    raise AssertionError("episode did not end")


def test_registered_and_configurable_by_name():
    assert "longtail" in registered_envs()
    env = make_env("longtail", {"min_turns": 2, "max_turns": 2, "turns_alpha": 0})
    observation, info = env.reset(3)
    assert (
        observation.startswith("Step 0: tool returned:")
        and "<answer>" in info["instruction"]
    )
    assert len(play(env, 3)) == 2
    with pytest.raises(ValueError, match="min_turns <= max_turns"):
        make_env("longtail", {"min_turns": 3, "max_turns": 2})
    with pytest.raises(ValueError, match="slow_step_prob"):
        make_env("longtail", {"slow_step_prob": 2})
    with pytest.raises(ValueError, match="'turns' is not accepted"):
        make_env("longtail", {"turns": 2})


def test_pareto_turns_have_a_heavy_capped_tail():
    assert pareto_turns(1.0, 1, 12, 1.2) == 1
    assert pareto_turns(0.5**1.2, 1, 12, 1.2) == 2  # floor(u ** (-1/alpha)) = 2
    assert pareto_turns(1e-9, 1, 12, 1.2) == 12  # capped
    assert pareto_turns(0.3, 3, 12, 0.0) == 3  # alpha 0: fixed
    env = make_env(
        "longtail",
        {
            "min_turns": 1,
            "max_turns": 12,
            "turns_alpha": 1.2,
            "vary_within_group": False,
        },
    )
    turns = [len(play(env, seed)) for seed in range(400)]
    share = lambda k: sum(t >= k for t in turns) / len(turns)  # noqa: E731
    assert 0.35 < share(2) < 0.52  # 2 ** -1.2 = 0.44
    assert 0.10 < share(4) < 0.28  # 4 ** -1.2 = 0.19
    assert max(turns) == 12 and min(turns) == 1


def test_draws_are_repeatable_and_vary_within_a_group_only_through_the_actions():
    config = {
        "min_turns": 1,
        "max_turns": 12,
        "turns_alpha": 0.7,
        "step_latency_s": 0.001,
        "step_latency_sigma": 1.0,
        "max_step_latency_s": 0.01,
    }
    env = make_env("longtail", config)
    assert play(env, 5) == play(env, 5)  # same seed, same actions: same episode
    other_actions = [
        play(env, 5, actions=lambda turn, k=k: f"reply {k} {turn}") for k in range(10)
    ]
    assert len({len(s) for s in other_actions}) > 1  # group members (same seed) differ
    fixed = make_env("longtail", {**config, "vary_within_group": False})
    assert (
        len(
            {
                len(play(fixed, 5, actions=lambda turn, k=k: f"reply {k} {turn}"))
                for k in range(10)
            }
        )
        == 1
    )


def test_step_latency_is_lognormal_capped_with_rare_slow_steps():
    env = make_env(
        "longtail",
        {
            "step_latency_s": 0.1,
            "step_latency_sigma": 1.0,
            "max_step_latency_s": 1.0,
            "slow_step_prob": 0.05,
            "slow_step_s": 5.0,
        },
    )
    env.reset(1)
    delays = sorted(env.draw_step_latency(turn, f"a{turn}") for turn in range(2000))
    median = delays[len(delays) // 2]
    assert 0.08 < median < 0.13
    slow = [d for d in delays if d >= 5.0]
    assert 0.03 < len(slow) / len(delays) < 0.07
    assert max(d for d in delays if d < 5.0) <= 1.0


def test_step_sleeps_for_the_drawn_latency():
    env = make_env(
        "longtail",
        {"min_turns": 1, "max_turns": 1, "turns_alpha": 0, "step_latency_s": 0.05},
    )
    env.reset(0)
    started = time.perf_counter()
    _, reward, terminated, _, info = env.step("x")
    assert time.perf_counter() - started >= 0.05
    assert terminated and reward == 1.0 and info["metrics"]["success"]
    with pytest.raises(RuntimeError):
        env.step("after the end")
