"""Agent frameworks against the agent endpoint: a real OpenAI Agents SDK ``Agent`` with one
``@function_tool``, run by ``Runner.run`` on ``OpenAIChatCompletionsModel`` and on the SDK's default
``OpenAIResponsesModel``, over the session's ``AsyncOpenAI`` client, with the fake-engine harness of
test_agent_tools.py (call 1 answers with the family's tool call, call 2 with a plain reply). No Ray, no vLLM
engine, no network: the SDK's tracing is off.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

pytest.importorskip("openai")
pytest.importorskip("vllm")  # the tool parsers
pytest.importorskip(
    "agents",
    reason="the OpenAI Agents SDK (pip install openai-agents) is not installed",
)

from test_agent_tools import agent_config, scripted  # noqa: E402

from roll_async.testing.family_tokenizers import build_family_test_tokenizer  # noqa: E402
from tests.unit.agent_gateway.test_agent_sessions import play_one  # noqa: E402

MODEL_CLASSES = {
    "agents_sdk_chat_agent": "OpenAIChatCompletionsModel",
    "agents_sdk_responses_agent": "OpenAIResponsesModel",
}
#: ModelSettings fields that make the SDK send store, metadata, parallel_tool_calls, reasoning
#: (reasoning_effort on chat), truncation, top_logprobs (+ logprobs / include), verbosity: the endpoint
#: accepts and ignores them, none changes how the tokens are sampled.
IGNORED_SETTINGS = {
    "store": False,
    "metadata": {"run": "test"},
    "parallel_tool_calls": True,
    "reasoning": {"effort": "low"},
    "truncation": "disabled",
    "top_logprobs": 2,
    "verbosity": "low",
}


async def run_sdk_agent(agent: str, env_config: dict | None = None):
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine, outs = scripted(tokenizer, "qwen2_5")
    config = agent_config(agent)
    config.custom_envs["Agent"].env_config = env_config or {}
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    return trajectory, engine, outs, tokenizer


@pytest.mark.parametrize("agent", sorted(MODEL_CLASSES))
async def test_an_agents_sdk_agent_runs_its_tool_token_exact(agent):
    trajectory, engine, outs, tokenizer = await run_sdk_agent(agent)
    metrics = trajectory.metrics
    assert metrics[f"model_class_{MODEL_CLASSES[agent]}"] == 1.0
    assert (
        metrics["tool_ran_for_paris"] == 1.0
    )  # the tool ran with the parsed arguments
    assert metrics["finished_sunny"] == 1.0  # the agent finished on the plain reply
    assert metrics["model_calls"] == 2.0
    assert metrics["agent_tool_calls"] == 1.0
    assert metrics["agent_segment_breaks"] == 0.0
    p0, p1 = engine.prompts
    assert p1[: len(p0) + len(outs[0])] == p0 + outs[0]  # never a re-render of a reply
    assert "sunny in Paris" in tokenizer.decode(p1[len(p0) + len(outs[0]) :])
    assert trajectory.token_ids == p1 + outs[1]
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == outs[0] + outs[1]


@pytest.mark.parametrize("agent", sorted(MODEL_CLASSES))
async def test_settings_that_do_not_change_sampling_are_accepted_and_ignored(agent):
    plain, engine, _, _ = await run_sdk_agent(agent)
    other, engine2, _, _ = await run_sdk_agent(
        agent, {"model_settings": IGNORED_SETTINGS}
    )
    assert other.metrics["tool_ran_for_paris"] == 1.0
    assert other.metrics["finished_sunny"] == 1.0
    assert other.metrics["agent_segment_breaks"] == 0.0
    assert engine2.prompts == engine.prompts
    assert other.token_ids == plain.token_ids
    assert other.response_mask == plain.response_mask


async def test_server_side_state_stays_refused():
    """auto_previous_response_id: the SDK's second call sends previous_response_id, a 400 naming it."""
    trajectory, engine, _, _ = await run_sdk_agent(
        "agents_sdk_responses_agent", {"auto_previous_response_id": True}
    )
    assert trajectory.metrics["refused_status"] == 400.0
    assert trajectory.metrics["refused_param_previous_response_id"] == 1.0
    assert len(engine.requests) == 1  # the refused call never reached the engine
