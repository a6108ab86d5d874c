"""``env_type: verifiers:<taskset module>`` with verifiers >= 0.4 (``verifiers.v1``) against a FAKE engine.

The shared venv holds verifiers 0.3.1 (the classic API: test_env_verifiers.py), because 0.4.0 pins openai and
mcp below what vLLM and the Agents SDK need here; 0.4.0 itself imports and runs with them. So
:func:`test_the_v1_api_passes_with_verifiers_0_4` runs this file again in a subprocess with verifiers 0.4.0
first on the path (``scripts/setup.sh`` installs it, without its dependencies, into
``.venv/verifiers-0.4``, or the folder ROLL_ASYNC_VERIFIERS_V1 names); there the other tests run for real. The taskset is
roll_async/testing/verifiers_v1_taskset.py: tasks ``What is i + i?`` scored ``correct`` (weight 1) and
``replied`` (0.5), played by an in-process chat harness through verifiers' interception proxy.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_async.envs.adapters.verifiers_env import (
    load_verifiers_env,
    row_for_seed,
    verifiers_api,
)
from roll_async.errors import ConfigError
from roll_async.pipelines.preflight import check_envs
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from tests.unit.envs.verifiers_play import play, replying, verifiers_config

pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[3]
ENV_TYPE = "verifiers:roll_async.testing.verifiers_v1_taskset"
#: Where scripts/setup.sh puts verifiers 0.4.0 (``pip install --no-deps --target``); ROLL_ASYNC_VERIFIERS_V1 overrides.
V1_TARGET = Path(
    os.environ.get("ROLL_ASYNC_VERIFIERS_V1") or Path(sys.prefix) / "verifiers-0.4"
)


def _installed_api() -> str | None:
    try:
        return verifiers_api("test")
    except ConfigError:
        return None


needs_v1 = pytest.mark.skipif(
    _installed_api() != "v1",
    reason="verifiers >= 0.4 is not first on the path (run by test_the_v1_api_passes_with_verifiers_0_4)",
)


@pytest.mark.slow  # a second interpreter importing verifiers 0.4 and its stack: ~30 s on a loaded CI
@pytest.mark.skipif(
    _installed_api() == "v1", reason="this process already runs verifiers >= 0.4"
)
def test_the_v1_api_passes_with_verifiers_0_4():
    if not (V1_TARGET / "verifiers" / "v1").is_dir():
        pytest.skip(f"verifiers 0.4 is not installed in {V1_TARGET} (scripts/setup.sh)")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(V1_TARGET), str(REPO)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert "6 passed, 1 skipped" in tail, tail


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


@needs_v1
def test_the_taskset_s_tasks_are_the_rows():
    env = load_verifiers_env(ENV_TYPE, {"taskset": {"num_rows": 5}}, "k")
    assert env.api == "v1" and env.num_rows == 5
    assert row_for_seed(12, env.num_rows) == 2


@needs_v1
async def test_the_rubric_reward_is_the_episode_reward_and_scores_are_metrics(
    tokenizer,
):
    engine = replying(tokenizer, "2")  # seed 7 over 3 tasks -> task 1, "What is 1 + 1?"
    trajectory, _ = await play(verifiers_config(ENV_TYPE), engine, tokenizer, seed=7)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 1.5
    assert trajectory.metrics["rubric_correct"] == 1.0
    assert trajectory.metrics["rubric_replied"] == 1.0
    assert trajectory.metrics["rubric_num_calls"] == 1.0
    assert trajectory.metrics["verifiers_row"] == 1.0
    assert "What is 1 + 1?" in tokenizer.decode(engine.prompts[0])
    wrong = replying(tokenizer, "7")
    trajectory, _ = await play(verifiers_config(ENV_TYPE), wrong, tokenizer, seed=7)
    assert trajectory.episode_reward == 0.5


@needs_v1
async def test_a_two_turn_harness_is_token_exact_through_the_interception_proxy(
    tokenizer,
):
    engine = replying(tokenizer, "3", "4")  # seed 2 -> task 2, answer 4
    config = verifiers_config(ENV_TYPE, {"taskset": {"turns": 2}})
    trajectory, _ = await play(config, engine, tokenizer, seed=2)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["agent_calls"] == 2.0
    assert trajectory.metrics["agent_segment_breaks"] == 0.0
    p0, p1 = engine.prompts
    first = tokenizer.encode("3", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert p1[: len(p0) + len(first)] == p0 + first
    assert trajectory.episode_reward == 1.5


@needs_v1
async def test_episodes_running_at_once_each_get_their_reward(tokenizer):
    config = verifiers_config(ENV_TYPE, {"taskset": {"turns": 2}})
    engines = [replying(tokenizer, "1", "4") for _ in range(3)]
    for index, engine in enumerate(engines):  # the last to start ends first
        engine.latency_s = 0.2 * (len(engines) - 1 - index)
    played = await asyncio.gather(
        *(play(config, engine, tokenizer, seed=2) for engine in engines)
    )
    for trajectory, _ in played:
        assert trajectory.stop_reason == "terminated", trajectory.error
        assert trajectory.episode_reward == 1.5


@needs_v1
async def test_a_harness_that_raises_mid_episode_is_an_env_error(tokenizer):
    engine = replying(tokenizer, "3", "4")
    config = verifiers_config(
        ENV_TYPE, {"taskset": {"turns": 2, "raise_on_turn": True}}
    )
    trajectory, manager = await play(config, engine, tokenizer, seed=0)
    assert trajectory.stop_reason == "env_error"
    assert "the harness turn failed" in (trajectory.error or "")
    assert manager.stats.env_errors == 1


@needs_v1
def test_a_taskset_that_cannot_load_fails_at_check_in_one_line():
    for env_type, needle in (
        ("verifiers:no_such_taskset_module", "no_such_taskset_module"),
        ("verifiers:roll_async.testing.verifiers_envs", "defines no `__all__`"),
    ):
        with pytest.raises(ConfigError) as info:
            check_envs(verifiers_config(env_type))
        message = str(info.value)
        assert "\n" not in message and needle in message, message
        assert "custom_envs.Vf.env_type" in message
        assert "pip install 'roll-async[verifiers]'" in message
