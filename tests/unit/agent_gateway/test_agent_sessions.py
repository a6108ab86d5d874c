"""Agent sessions in one process: the real openai client and aiohttp gateway, a FAKE engine (no model).

The real-engine versions of the token-exactness and history-rewrite checks are in
tests/integration/test_agent_sessions_real_engine.py.
"""

from __future__ import annotations

import pytest

from roll_async import metrics
from roll_async.agent_gateway.errors import context_length_exceeded
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.env_managers.worker import build_env_managers
from roll_async.errors import ConfigError
from roll_async.pipelines.preflight import check_envs
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import EpisodeSpec

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def agent_config(
    agent: str, *, max_steps: int = 6, env_step_timeout_s: float = 30.0
) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=512,
        rollout_batch_size=1,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent=f"roll_async.testing.agents:{agent}",
                max_steps=max_steps,
                max_tokens_per_step=16,
                env_config={"level": 2},
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1,
            group_size=1,
            tags=["Agent"],
            env_step_timeout_s=env_step_timeout_s,
        ),
    )
    validate_config(config)
    return config


async def play_one(config: PipelineConfig, engine: FakeEngine, tokenizer):
    (manager,) = build_env_managers(
        rollout_spec(config, "train"),
        [(0, "Agent")],
        scheduler=None,
        engine_for=lambda _: engine,
        tokenizer=tokenizer,
    )
    try:
        return await manager._run_episode(
            EpisodeSpec(tag="Agent", group_id=3, episode_id=7, seed=11, created_step=0)
        ), manager
    finally:
        await manager.agent_gateway.stop()


async def test_an_append_only_agent_is_one_token_exact_trajectory(tokenizer):
    outputs = iter([[40, 41, 42], [43, 44, tokenizer.eos_token_id], [45, 46]])
    engine = FakeEngine(lambda r: next(outputs), logprob=-0.5)
    trajectory, manager = await play_one(
        agent_config("three_turn_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert (
        trajectory.episode_reward == 1.0 and trajectory.metrics["turns_played"] == 3.0
    )
    builder = ChatPromptBuilder(tokenizer, manager.settings.custom_env.system_prompt)
    prompts, outs = (
        engine.prompts,
        [[40, 41, 42], [43, 44, tokenizer.eos_token_id], [45, 46]],
    )
    assert prompts[0] == builder.render_ids(
        [
            {"role": "system", "content": "You are a test agent."},
            {"role": "user", "content": "Task with seed 11. Say something."},
        ],
        True,
    )
    for k in (1, 2):
        delta = builder.closure_ids_after(outs[k - 1]) + builder.continuation_ids(
            [{"role": "user", "content": f"Feedback {k - 1}: go on."}]
        )
        assert prompts[k] == prompts[k - 1] + outs[k - 1] + delta
    assert trajectory.token_ids == prompts[2] + outs[2]
    assert [
        trajectory.token_ids[i] for i, m in enumerate(trajectory.response_mask) if m
    ] == sum(outs, [])
    assert [
        lp for lp, m in zip(trajectory.logprobs, trajectory.response_mask) if m
    ] == [-0.5] * 8
    assert (
        trajectory.metrics["agent_segment_breaks"] == 0.0 and trajectory.num_turns == 3
    )
    assert (
        trajectory.oldest_weight_version == 0 and trajectory.newest_weight_version == 0
    )
    # max_tokens and stop come from the request; temperature / top_p are the config's (the trainer scores under them)
    request = engine.requests[0]
    generation = manager.settings.generation
    assert (request.max_tokens, request.stop) == (8, ["STOP"])
    assert (
        (request.temperature, request.top_p)
        == (generation.temperature, generation.top_p)
        != (0.9, 0.95)
    )
    assert trajectory.metrics["agent_sampling_overrides"] == 3.0


async def test_a_history_rewrite_starts_a_counted_segment_and_the_last_segment_is_trained(
    tokenizer,
):
    engine = FakeEngine(tokens_per_request=3)
    trajectory, manager = await play_one(
        agent_config("history_rewriting_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated" and trajectory.episode_reward == 0.5
    builder = manager.prompts
    p0, p1, p2 = engine.prompts
    rewritten = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "(summary of my reply)"},
        {"role": "user", "content": "Continue."},
    ]
    assert p1 == builder.render_ids(
        rewritten, True
    )  # a fresh render, not p0 + output + delta
    assert p2[: len(p1) + 3] == p1 + [5, 5, 5]  # call 3 extends call 2 token-exactly
    assert trajectory.token_ids == p2 + [5, 5, 5] and trajectory.num_turns == 2
    assert (
        trajectory.metrics["agent_segment_breaks"] == 1.0
        and trajectory.metrics["agent_segments"] == 2.0
    )
    assert trajectory.metrics["agent_dropped_generated_tokens"] == 3.0
    # a request's max_tokens only lowers max_tokens_per_step
    assert engine.requests[2].max_tokens == 16
    assert (
        metrics.rollout_metrics([trajectory], step=0)[metrics.AGENT_SEGMENT_BREAKS]
        == 1.0
    )


@pytest.mark.parametrize(
    ("agent", "timeout_s", "error"),
    [
        ("raising_agent", 60.0, "agent raised RuntimeError: agent bug"),
        ("idling_agent", 1.0, "env_step_timeout_s=1.0s"),
    ],
)
async def test_agent_exceptions_and_timeouts_are_counted_env_errors(
    tokenizer, agent, timeout_s, error
):
    engine = FakeEngine(tokens_per_request=2)
    trajectory, manager = await play_one(
        agent_config(agent, env_step_timeout_s=timeout_s), engine, tokenizer
    )
    assert trajectory.stop_reason == "env_error" and error in trajectory.error
    assert manager.stats.env_errors == 1


async def test_unservable_requests_get_openai_errors_not_hangs(tokenizer):
    engine = FakeEngine(tokens_per_request=2)
    trajectory, _ = await play_one(
        agent_config("unservable_requests_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    answered = {
        k: trajectory.metrics[k]
        for k in ("tools", "n2", "wrong_model", "completions_endpoint")
    }
    assert answered == {
        "tools": 400.0,
        "n2": 400.0,
        "wrong_model": 404.0,
        "completions_endpoint": 404.0,
    }
    assert len(engine.requests) == 1  # refused requests never reach the engine


async def test_calls_over_max_steps_end_the_episode_with_max_steps(tokenizer):
    engine = FakeEngine(tokens_per_request=2)
    trajectory, _ = await play_one(
        agent_config("three_turn_agent", max_steps=2), engine, tokenizer
    )
    assert (
        trajectory.stop_reason == "max_steps"
        and trajectory.num_turns == 2
        and trajectory.episode_reward == 0.0
    )


@pytest.mark.parametrize("mode", ["catch", "raise", "recover"])
async def test_an_agent_over_sequence_length_is_kept_truncated(tokenizer, mode):
    """The call that leaves no room under sequence_length is refused (400 context_length_exceeded) and the
    episode is kept up to it, stop reason max_length, as env episodes at the limit are. An agent that
    catches the refusal keeps its reward and metrics; one that lets it propagate has none to keep: reward 0,
    flagged agent_unrewarded_limit. A later served call (the agent shortened its history) clears the limit."""
    config = agent_config("overrunning_agent", max_steps=20)
    config.sequence_length = 96
    config.custom_envs["Agent"].env_config = {
        "catch": mode != "raise",
        "recover": mode == "recover",
    }
    engine = FakeEngine(tokens_per_request=16)
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.error is None
    got = trajectory.metrics
    if mode == "recover":
        assert trajectory.stop_reason == "terminated" and got["agent_segments"] == 2.0
        assert trajectory.token_ids[: len(engine.prompts[-1])] == engine.prompts[-1]
    else:
        assert trajectory.stop_reason == "max_length"
        # the last served call, its reply cut to fit: the sequence is full, nothing after it
        assert trajectory.token_ids[: len(engine.prompts[-1])] == engine.prompts[-1]
        assert len(trajectory.token_ids) == config.sequence_length
    assert trajectory.num_turns >= 1
    if mode == "raise":
        assert trajectory.episode_reward == 0.0 and "refused_for_length" not in got
        assert got["agent_unrewarded_limit"] == 1.0
    else:
        assert trajectory.episode_reward == 0.5 and got["refused_for_length"] == 1.0
        assert got["agent_unrewarded_limit"] == 0.0
    batch = metrics.rollout_metrics([trajectory], step=0)
    assert batch[metrics.AGENT_UNREWARDED_LIMITS] == float(mode == "raise")


def test_agent_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="env_type: agent and agent"):
        validate_config(
            PipelineConfig(
                custom_envs={"A": CustomEnvConfig(env_type="agent")},
                train_env_manager=EnvManagerConfig(tags=["A"]),
                rollout_batch_size=16,
            )
        )
    config = agent_config("three_turn_agent")
    config.custom_envs[
        "Agent"
    ].agent = "roll_async.testing.scripted_envs:scripted_env_factory"
    with pytest.raises(
        ConfigError, match="custom_envs.Agent.agent=.*not an `async def`"
    ):
        check_envs(config)
    config.custom_envs["Agent"].agent = "roll_async.testing.agents:no_such_agent"
    with pytest.raises(ConfigError, match="has no attribute"):
        check_envs(config)


def test_the_length_refusal_reads_as_a_context_window_error_to_client_libraries():
    """litellm (mini-swe-agent's client) maps the refusal to its context-window error, so a harness stops
    or trims its history instead of retrying a call that can never be served."""
    checkers = pytest.importorskip(
        "litellm.litellm_core_utils.exception_mapping_utils"
    ).ExceptionCheckers
    refusal = context_length_exceeded(96, 120)
    assert refusal.status == 400 and refusal.body()["error"]["code"] == (
        "context_length_exceeded"
    )
    assert checkers.is_error_str_context_window_exceeded(refusal.message)
