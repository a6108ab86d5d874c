"""An OpenAI-client agent driving a swe task's workspace (``env_type: swe`` with ``agent``), on the local runtime.

Episodes run through the real EnvManager agent path (the openai client, the aiohttp gateway, a FAKE engine
whose replies are scripted) in the workspace the swe env starts for the task. The reward is the hidden
tests' verdict: the reference solution run through the handle scores 1, doing nothing scores 0 although
the agent claims 1, editing the tests and writing reward files scores 0; an agent that raises, hangs past
its time or is cancelled leaves no process, file or runtime behind. mini-swe-agent's own ``DefaultAgent``
runs unmodified with the handle as its environment (skipped where mini-swe-agent is not installed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.env_managers.env_manager import EnvManager
from roll_async.env_managers.worker import build_env_managers
from roll_async.envs import make_env
from roll_async.envs.swe.agent_workspace import SUBMIT_MARKER, SweAgentEpisode
from roll_async.envs.swe.env import SweConfig, load_tasks
from roll_async.errors import ConfigError, InvalidInputError, LifecycleError
from roll_async.pipelines.preflight import check_envs
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.workspace_runtimes import leftovers, owners, skip_reason
from roll_async.trajectory import EpisodeSpec, Trajectory
from roll_async.workspaces.local import LocalRuntime
from roll_async.workspaces.shared import shared_runtimes

pytest.importorskip("openai")
# mini-swe-agent's litellm: the model prices it ships, no download (the test host is offline)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytestmark = pytest.mark.skipif(
    skip_reason("local") is not None, reason=skip_reason("local") or ""
)

SUBMIT = f"```bash\necho {SUBMIT_MARKER}\n```"
#: The red-team probes' edit_tests and fake_reward_files commands (tests/security/test_swe_probes.py).
CHEAT = (
    "mkdir -p tests && printf 'def test_add():\\n    pass\\n' > tests/test_calc_add.py; "
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo 1 > reward.txt; "
    "echo 1 > /tmp/reward.txt"
)
LOOP = "examples.agent_swe:play_in_shell"
AIDS = "roll_async.testing.workspace_agents"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_chatml_test_tokenizer()


@pytest.fixture
def workspaces(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What identifies each workspace the local runtime starts, for :func:`leftovers` once it closed."""
    started: list[Any] = []
    start = LocalRuntime.start

    async def recording(self: LocalRuntime, spec: Any) -> Any:
        workspace = await start(self, spec)
        started.append(owners(workspace))
        return workspace

    monkeypatch.setattr(LocalRuntime, "start", recording)
    return started


def solution(task_format: str, task_id: str) -> str:
    (task,) = load_tasks(SweConfig(task_format=task_format, task_ids=[task_id]))
    assert task.solution
    return task.solution


def swe_config(
    agent: str, sequence_length: int = 2048, **env_config: Any
) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=sequence_length,
        rollout_batch_size=1,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Swe": CustomEnvConfig(
                env_type="swe",
                agent=agent,
                max_steps=4,
                max_tokens_per_step=512,
                env_config={
                    "task_ids": ["calc_add"],
                    "runtime": "local",
                    "command_timeout_s": 30,
                    **env_config,
                },
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Swe"], env_step_timeout_s=60
        ),
    )
    config.engine.max_model_len = max(config.engine.max_model_len, sequence_length)
    validate_config(config)
    return config


@pytest.fixture
async def play(tokenizer: Any) -> AsyncIterator[Callable[..., Any]]:
    """``await play(config, replies)``: one episode whose model calls get ``replies`` in turn (the last repeats);
    the EnvManager's env is discarded and its closes awaited at the end, as a worker's are."""
    managers: list[EnvManager] = []

    async def run(
        config: PipelineConfig, replies: list[str], cancel_after_s: float | None = None
    ) -> tuple[Trajectory | None, FakeEngine]:
        outputs = [
            tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id]
            for r in replies
        ]
        engine = FakeEngine()
        engine._output_fn = lambda request: outputs[
            min(len(engine.requests) - 1, len(outputs) - 1)
        ]
        (manager,) = build_env_managers(
            rollout_spec(config, "train"),
            [(0, "Swe")],
            scheduler=None,
            engine_for=lambda _: engine,
            tokenizer=tokenizer,
        )
        managers.append(manager)
        episode = asyncio.create_task(
            manager._run_episode(
                EpisodeSpec(tag="Swe", group_id=0, episode_id=0, seed=0, created_step=0)
            )
        )
        if cancel_after_s is None:
            return await episode, engine
        while not engine.requests:
            await asyncio.sleep(0.05)
        await asyncio.sleep(cancel_after_s)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode
        return None, engine

    yield run
    for manager in managers:
        manager.env_calls.discard()
        await manager.wait_closed()
        assert manager.agent_gateway is not None
        await manager.agent_gateway.stop()
    # every env gave its lease back: the shared runtime shut down
    assert shared_runtimes() == 0


@pytest.mark.parametrize(
    ("task_format", "task_id"),
    [("harbor", "calc_add"), ("swe", "roll-async__calc_add")],
)
async def test_the_reference_solution_through_the_handle_scores_one(
    play: Any, workspaces: list[Any], tokenizer: Any, task_format: str, task_id: str
) -> None:
    fix = f"Applying the fix.\n```bash\n{solution(task_format, task_id)}```"
    config = swe_config(LOOP, task_format=task_format, task_ids=[task_id])
    trajectory, engine = await play(config, [fix, SUBMIT])
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 1.0
    got = trajectory.metrics
    assert got["success"] == 1.0 and got["agent_submitted"] == 1.0
    assert got["commands"] == 2.0 and got["shell_commands"] == 2.0
    assert got["agent_calls"] == 2.0 and got["agent_segment_breaks"] == 0.0
    assert got["workspace_start_s"] > 0 and got["verifier_seconds"] > 0
    # the report's timeline: the workspace start, the agent's two commands and the verifier, in order
    spans = trajectory.env_spans
    assert [s.name for s in spans] == ["workspace_start_cold", "exec", "exec", "verify"]
    assert all(a.finished_at <= b.started_at for a, b in zip(spans, spans[1:]))
    # the raw task instruction, without the stepped env's action-format guidance
    assert "add(2, 3)" in tokenizer.decode(engine.prompts[0])
    # the command's output came back as the next user message, token-exact
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    assert len(workspaces) == 1 and leftovers(workspaces[0]) == []


async def test_doing_nothing_scores_zero_whatever_the_agent_claims(
    play: Any, workspaces: list[Any]
) -> None:
    trajectory, _ = await play(swe_config(f"{AIDS}:claiming_agent"), [SUBMIT])
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 0.0
    assert trajectory.metrics["agent_submitted"] == 1.0
    # the agent's own metrics are kept, but not over the verifier's
    assert trajectory.metrics["claimed"] == 1.0 and trajectory.metrics["success"] == 0.0
    assert leftovers(workspaces[0]) == []


async def test_editing_tests_and_writing_reward_files_scores_zero(
    play: Any, workspaces: list[Any]
) -> None:
    for task_format, task_id in (
        ("harbor", "calc_add"),
        ("swe", "roll-async__calc_add"),
    ):
        config = swe_config(
            f"{AIDS}:claiming_agent", task_format=task_format, task_ids=[task_id]
        )
        trajectory, _ = await play(config, [f"```bash\n{CHEAT}\n```"])
        assert trajectory.metrics["commands"] == 1.0
        assert trajectory.episode_reward == 0.0, (task_format, trajectory.metrics)
    assert len(workspaces) == 2 and all(leftovers(w) == [] for w in workspaces)


async def test_an_agent_that_raises_leaves_nothing_behind(
    play: Any, workspaces: list[Any]
) -> None:
    config = swe_config(f"{AIDS}:raising_agent")
    left = "setsid nohup sleep 600 >/dev/null 2>&1 & echo left"
    trajectory, _ = await play(config, [f"```bash\n{left}\n```"])
    assert trajectory.stop_reason == "env_error"
    assert "the agent broke after its first command, which printed 'left" in (
        trajectory.error or ""
    )
    assert await _closed(workspaces)


async def _closed(workspaces: list[Any], within_s: float = 20.0) -> bool:
    """True once every recorded workspace left nothing (the discarded env closes in the background)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while any(leftovers(w) for w in workspaces):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return bool(workspaces)


async def test_a_cancelled_episode_closes_its_workspace_mid_command(
    play: Any, workspaces: list[Any]
) -> None:
    config = swe_config(f"{AIDS}:hanging_agent")
    await play(config, ["```bash\nsleep 30\n```"], cancel_after_s=1.0)
    assert await _closed(workspaces)


async def test_past_the_agent_time_the_agent_is_stopped_and_its_work_still_scored(
    play: Any, workspaces: list[Any]
) -> None:
    fix = f"```bash\n{solution('harbor', 'calc_add')}```"
    trajectory, _ = await play(
        swe_config(f"{AIDS}:hanging_agent", agent_timeout_s=3), [fix]
    )
    assert trajectory.stop_reason == "max_steps", trajectory.error
    assert trajectory.metrics["agent_out_of_time"] == 1.0
    assert trajectory.episode_reward == 1.0
    assert leftovers(workspaces[0]) == []


async def test_handle_protocol_timeouts_and_the_end_of_the_episode() -> None:
    env = make_env(
        "swe", {"task_ids": ["calc_add"], "runtime": "local", "command_timeout_s": 2}
    )
    try:
        await env.reset(0)
        episode = SweAgentEpisode(env)
        handle = episode.handle
        assert (
            handle.instruction.startswith("`add(2, 3)` returns -1")
            and handle.task_id == "calc_add"
        )
        out = await handle.aexecute({"command": "id -u; cat calc.py | head -2"})
        assert (
            out["returncode"] == 0
            and "def add" in out["output"]
            and out["exception_info"] == ""
        )
        assert out["output"].split()[0] != "0"  # the agent user, never root
        slow = await handle.aexecute("sleep 20", timeout=60)  # cut to command_timeout_s
        assert (
            slow["returncode"] == -1 and "timed out after 2 s" in slow["exception_info"]
        )
        with pytest.raises(LifecycleError, match="aexecute"):
            handle.execute(
                "true"
            )  # on the event loop it would block the workspace it waits for
        threaded = await asyncio.to_thread(handle.execute, "echo from-a-thread")
        assert threaded["output"].strip() == "from-a-thread"
        with pytest.raises(InvalidInputError):
            await handle.aexecute({"cmd": "ls"})
        assert {"system", "release", "machine", "cwd", "timeout"} <= set(
            handle.get_template_vars()
        )
        assert (
            handle.serialize()["info"]["config"]["environment"]["task_id"] == "calc_add"
        )
        await episode.close()
        verdict = await env.verify()
        assert verdict.reward == 0.0 and env.workspace is None
        with pytest.raises(LifecycleError, match="episode is over"):
            await handle.aexecute("true")
        metrics = episode.metrics(verdict)
        assert metrics["commands"] == 3.0 and metrics["command_timeouts"] == 1.0
    finally:
        await env.close()
    assert shared_runtimes() == 0


def test_config_keys_fail_at_load_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="env_type: agent and agent"):
        config = swe_config(LOOP)
        config.custom_envs["Swe"].env_type = "sokoban"
        validate_config(config)
    with pytest.raises(ConfigError, match="isolation: none"):
        config = swe_config(LOOP)
        config.custom_envs["Swe"].isolation = "process"
        validate_config(config)
    for key, value, match in (
        ("action_format", "text", "env_config.action_format is used only when"),
        ("max_steps", 5, "custom_envs.<tag>.max_steps"),
        ("bogus", 1, "'bogus' is not accepted by swe"),
    ):
        config = swe_config(LOOP, **{key: value})
        with pytest.raises(ConfigError, match=match):
            check_envs(config)


@pytest.mark.skipif(
    os.environ.get("ROLL_ASYNC_SKIP_MINI_SWE") == "1", reason="asked to skip"
)
async def test_mini_swe_agent_s_default_agent_runs_unmodified_on_the_handle(
    play: Any, workspaces: list[Any]
) -> None:
    pytest.importorskip("minisweagent")
    pytest.importorskip("litellm")
    fix = solution("harbor", "calc_add")
    replies = [
        f"THOUGHT: apply the fix.\n\n```mswea_bash_command\n{fix}```",
        f"THOUGHT: done.\n\n```mswea_bash_command\necho {SUBMIT_MARKER}\n```",
    ]
    # mini-swe-agent's own prompts are long in the test tokenizer's ids
    config = swe_config("examples.agent_swe:play_mini_swe_agent", sequence_length=8192)
    trajectory, engine = await play(config, replies)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 1.0
    assert (
        trajectory.metrics["submitted"] == 1.0
    )  # DefaultAgent ended on the handle's Submitted
    assert (
        trajectory.metrics["agent_calls"] == 2.0
        and trajectory.metrics["agent_segment_breaks"] == 0.0
    )
    assert leftovers(workspaces[0]) == []
