"""``env_type: swe``: episodes in both action formats and the reward on the local runtime, and the oracle over every shipped task on every runtime.

The oracle runs each task's reference solution through the bash tool (Harbor format) and through a
fenced block (SWE rows) and must score 1; submitting without a change must score 0, in both formats.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from roll_async.envs import make_env
from roll_async.envs.swe.actions import parse_text, parse_tools
from roll_async.envs.swe.env import SweEnv, percentile
from roll_async.envs.swe.shipped import SHIPPED_TASKS
from roll_async.envs.tool_actions import encode_tool_calls
from roll_async.errors import ConfigError, DatasetError, LifecycleError
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.workspace_runtimes import RUNTIMES, skip_reason
from roll_async.workspaces.shared import shared_runtimes

SUBMIT_TOOL = encode_tool_calls([{"name": "submit", "arguments": {}}])


def bash(command: str) -> str:
    return encode_tool_calls([{"name": "bash", "arguments": {"command": command}}])


def editor(**arguments: Any) -> str:
    return encode_tool_calls([{"name": "str_replace_editor", "arguments": arguments}])


@pytest.fixture
async def env_factory() -> AsyncIterator[Any]:
    reason = skip_reason("local")
    if reason:
        pytest.skip(reason)
    made: list[SweEnv] = []

    def build(**config: Any) -> SweEnv:
        env = make_env("swe", config)
        made.append(env)
        return env

    yield build
    for env in made:
        await env.close()


def seed_of(name: str) -> int:
    return [t.name for t in SHIPPED_TASKS].index(name)


async def test_tools_episode_edits_with_the_editor_and_scores_one(
    env_factory: Any,
) -> None:
    env = env_factory(task_ids=["calc_add"])
    observation, info = await env.reset(0)
    assert "add(2, 3)" in info["instruction"] and [
        t["function"]["name"] for t in info["tools"]
    ] == ["bash", "str_replace_editor", "submit"]
    obs, reward, terminated, truncated, step_info = await env.step(
        editor(command="view", path="calc.py")
    )
    assert (
        "     1\tdef add(a, b):" in obs
        and reward == 0
        and not (terminated or truncated)
    )
    assert "workspace_start_s" not in step_info["metrics"]
    obs, *_ = await env.step(
        editor(command="str_replace", path="calc.py", old_str="x", new_str="y")
    )
    assert "occurs 0 times" in obs
    obs, *_ = await env.step(
        editor(
            command="str_replace",
            path="calc.py",
            old_str="return a - b\n\n\ndef sub",
            new_str="return a + b\n\n\ndef sub",
        )
    )
    assert "edited calc.py" in obs
    obs, *_ = await env.step(
        editor(command="create", path="notes/n.txt", file_text="hi\n")
    )
    assert "created" in obs
    obs, reward, terminated, truncated, step_info = await env.step(SUBMIT_TOOL)
    assert (reward, terminated, truncated) == (1.0, True, False), obs
    assert step_info["metrics"]["success"] is True and "submitted" in obs
    # the workspace's cost, once per episode with its last step
    episode = step_info["metrics"]
    assert episode["workspace_start_s"] > 0 and episode["workspace_pool_hit"] == 0.0
    assert 0 < episode["exec_p50_s"] <= episode["exec_p99_s"]
    assert episode["output_truncations"] == 0.0 and episode["workspaces_alive"] == 1.0
    with pytest.raises(LifecycleError):
        await env.step(SUBMIT_TOOL)


async def test_text_format_and_format_errors(env_factory: Any) -> None:
    env = env_factory(
        action_format="text", task_ids=["greet_script"], format_penalty=-0.1
    )
    _, info = await env.reset(3)
    assert "tools" not in info and "```bash" in info["instruction"]
    obs, reward, *_, step_info = await env.step("no block here")
    assert (
        reward == pytest.approx(-0.1)
        and "exactly one" in obs
        and step_info["metrics"]["action_is_valid"] is False
    )
    obs, *_ = await env.step("```bash\necho one\n```\n```bash\necho two\n```")
    assert "found 2" in obs
    obs, *_ = await env.step("Let me look.\n```bash\ncat greet.sh\n```")
    assert "[exit code 0]" in obs and 'echo "Hello World"' in obs
    obs, reward, terminated, *_ = await env.step("```bash\nsubmit\n```")
    assert terminated and reward == 0.0 and "Episode over (submitted)" in obs


async def test_max_steps_and_the_agent_deadline_end_the_episode_with_a_verdict(
    env_factory: Any,
) -> None:
    env = env_factory(max_steps=2, task_ids=["calc_add"])
    await env.reset(0)
    *_, truncated, _ = await env.step(bash("true"))
    assert not truncated
    obs, reward, terminated, truncated, _ = await env.step(bash("true"))
    assert (reward, terminated, truncated) == (
        0.0,
        False,
        True,
    ) and "out of turns" in obs

    env = env_factory(agent_timeout_s=2, command_timeout_s=30, task_ids=["calc_add"])
    await env.reset(0)
    started = time.monotonic()
    obs, reward, terminated, truncated, info = await env.step(bash("sleep 60"))
    assert (
        truncated
        and reward == 0.0
        and "out of time" in obs
        and time.monotonic() - started < 30
    )
    assert info["metrics"]["command_timeouts"] == 1


async def test_observations_are_cut_to_the_token_budget_and_counted(
    env_factory: Any,
) -> None:
    tokenizer = build_chatml_test_tokenizer()
    env = env_factory(max_observation_tokens=100, task_ids=["calc_add"])
    env.use_tokenizer(tokenizer)
    await env.reset(0)
    obs, _, _, _, info = await env.step(bash("echo FIRST; seq 1 5000; echo LAST"))
    head, marker, tail = re.split(
        r"\n\.\.\. \[(\d+) tokens of output cut\] \.\.\.\n", obs
    )
    assert head.startswith("[exit code 0]\nFIRST\n1\n2\n") and tail.endswith(
        "4999\n5000\nLAST"
    )
    assert len(tokenizer.encode(head + tail, add_special_tokens=False)) <= 100
    assert int(marker) > 1000, "the middle of 5000 numbers was cut, and said so"
    obs, _, _, _, info = await env.step(bash("echo short"))
    assert obs == "[exit code 0]\nshort"
    *_, info = await env.step(SUBMIT_TOOL)
    assert info["metrics"]["output_truncations"] == 1.0


async def test_fraction_reward_counts_the_tests_that_pass(env_factory: Any) -> None:
    env = env_factory(
        task_format="swe", reward="fraction", task_ids=["roll-async__calc_add"]
    )
    await env.reset(0)
    *_, reward_none, _, _, _ = await env.step(SUBMIT_TOOL)
    assert reward_none == pytest.approx(0.5), (
        "test_sub passes before the fix, test_add does not"
    )


async def test_an_episode_reports_workspace_start_exec_and_verify_spans_in_order(
    env_factory: Any,
) -> None:
    env = env_factory(task_ids=["calc_add"])
    before = time.time()
    _, info = await env.reset(0)
    spans = list(info["env_spans"])
    for action in (
        bash("ls"),
        encode_tool_calls([{"name": "bash", "arguments": {"command": "true"}}] * 2),
    ):
        *_, info = await env.step(action)
        spans += info["env_spans"]
    *_, info = await env.step(SUBMIT_TOOL)
    spans += info["env_spans"]
    assert [s["name"] for s in spans] == [
        "workspace_start_cold",
        "exec",
        "exec",
        "exec",
        "verify",
    ]
    times = [t for s in spans for t in (s["started_at"], s["finished_at"])]
    assert times == sorted(times) and before <= times[0] and times[-1] <= time.time()


def test_config_errors_name_the_key(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="runtime"):
        make_env("swe", {"runtime": "podman"})
    with pytest.raises(ConfigError, match="tasks_path"):
        make_env("swe", {"tasks_path": str(tmp_path / "none")})
    with pytest.raises(DatasetError, match="task_ids"):
        _ = make_env("swe", {"task_ids": ["nope"]}).num_tasks
    with pytest.raises(ConfigError, match="max_observation_tokens") as replaced:
        make_env("swe", {"max_observation_chars": 1500})
    assert "'max_observation_chars' is no longer accepted" in str(replaced.value)
    with pytest.raises(ConfigError, match="max_observation_tokens"):
        make_env("swe", {"max_observation_tokens": 0})


def test_exec_percentiles_by_nearest_rank() -> None:
    times = [float(t) for t in range(1, 101)]
    assert (percentile(times, 0.5), percentile(times, 0.99)) == (50.0, 99.0)
    assert percentile([3.0], 0.99) == 3.0 and percentile([], 0.5) == 0.0


def test_action_parsers() -> None:
    turn = parse_tools(
        encode_tool_calls([{"name": "bash", "arguments": {"command": "ls"}}] * 3), 2
    )
    assert [c.shell for c in turn.commands] == ["ls", "ls"] and turn.dropped == 1
    assert parse_tools("plain text", 4).error.startswith("no tool call")
    assert (
        "unknown tool"
        in parse_tools(encode_tool_calls([{"name": "rm", "arguments": {}}]), 4).error
    )
    assert (
        parse_text("```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
        .commands[0]
        .kind
        == "submit"
    )
    assert parse_text("```sh\nls -la\n```").commands[0].shell == "ls -la"


async def _episode(
    runtime: str, fmt: str, task_format: str, seed: int, oracle: bool
) -> tuple[str, float, str]:
    env = make_env(
        "swe",
        {
            "action_format": fmt,
            "task_format": task_format,
            "runtime": runtime,
            # one warm container per task image: the second episode of a Harbor task takes it
            "runtime_config": {"pool_size": 1} if runtime == "docker" else {},
        },
    )
    try:
        await env.reset(seed)
        assert env.task is not None and env.task.solution
        total = 0.0
        if oracle:
            action = (
                bash(env.task.solution)
                if fmt == "tools"
                else f"```bash\n{env.task.solution}```"
            )
            obs, reward, *_ = await env.step(action)
            assert "[exit code 0]" in obs, obs
            total += reward
        obs, reward, terminated, *_ = await env.step(
            SUBMIT_TOOL if fmt == "tools" else "```bash\nsubmit\n```"
        )
        assert terminated
        return env.task.task_id, total + reward, obs
    finally:
        await env.close()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_oracle_scores_one_and_doing_nothing_zero_on_every_shipped_task(
    runtime: str,
) -> None:
    reason = skip_reason(runtime)
    if reason:
        pytest.skip(reason)
    began = time.monotonic()
    n = len(SHIPPED_TASKS)
    # the oracle through both action formats and both task formats; the no-op (submit at once) under
    # one task format per runtime, so each format's verifier refuses unfixed code on one runtime and each
    # runtime scores a no-op 0 (the suite's time budget: the verifier is most of an episode)
    noop = ("tools", "swe", False) if runtime == "docker" else ("text", "harbor", False)
    plans = [("tools", "harbor", True), ("text", "swe", True), noop]
    gate = asyncio.Semaphore(16)

    async def one(
        plan: tuple[str, str, bool], seed: int
    ) -> tuple[tuple[str, str, bool], str, float, str]:
        async with gate:
            return (plan, *await _episode(runtime, plan[0], plan[1], seed, plan[2]))

    results = await asyncio.gather(
        *(one(plan, seed) for plan in plans for seed in range(n))
    )
    wrong = [
        (plan, task, reward, obs[-200:])
        for plan, task, reward, obs in results
        if reward != float(plan[2])
    ]
    assert not wrong
    assert len({(plan, task) for plan, task, *_ in results}) == 3 * n
    # the episodes of one loop share one runtime, and the last close shut it down
    assert shared_runtimes() == 0
    # a bound against hangs: ~25 s (local) and ~60 s (docker) on a quiet 2-core host, far more under load
    assert time.monotonic() - began < 400, "the oracle over every task took too long"
