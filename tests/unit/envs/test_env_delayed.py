"""DelayedEnv: built-in envs with added latency, the same transitions, repeatable by seed."""

from __future__ import annotations

import time

import pytest

from roll_async.envs import make_env

INNER = {"inner_env_type": "sokoban", "inner_env_config": {"dim_room": [6, 6]}}


def test_fixed_latency_is_added_and_transitions_are_the_inner_envs():
    slow = make_env("delayed", {**INNER, "step_latency_s": 0.05})
    plain = make_env("sokoban", {"dim_room": [6, 6]})
    assert slow.reset(seed=11)[0] == plain.reset(seed=11)[0]
    start = time.perf_counter()
    slow_result = slow.step("<answer>Up</answer>")
    assert time.perf_counter() - start >= 0.05
    assert slow_result[:4] == plain.step("<answer>Up</answer>")[:4]
    assert slow.solve() == plain.solve()  # solver reachable through the wrapper


def test_lognormal_latency_is_seeded_and_capped():
    config = {
        **INNER,
        "step_latency_s": 0.001,
        "step_latency_sigma": 2.0,
        "max_step_latency_s": 0.004,
    }

    def delays(seed: int) -> list[float]:
        env = make_env("delayed", config)
        env.reset(seed=seed)
        return [env._step_delay() for _ in range(50)]

    assert delays(3) == delays(3)
    assert delays(3) != delays(4)
    assert max(delays(3)) <= 0.004 and min(delays(3)) < 0.001 < max(delays(3))


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="step_latency_s=-1"):
        make_env("delayed", {**INNER, "step_latency_s": -1})
    with pytest.raises(ValueError, match="'dim_rom' is not accepted by sokoban"):
        make_env(
            "delayed",
            {"inner_env_type": "sokoban", "inner_env_config": {"dim_rom": [6, 6]}},
        )
