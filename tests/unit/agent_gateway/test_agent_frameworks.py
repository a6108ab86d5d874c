"""Agent frameworks against the agent endpoint, with the fake-engine harness of test_agent_tools.py (call 1
answers with the family's tool call, call 2 with a plain reply; smolagents' call 2 is its ``final_answer``
call): a real OpenAI Agents SDK ``Agent`` with one ``@function_tool`` run by ``Runner.run`` on
``OpenAIChatCompletionsModel`` and on the SDK's default ``OpenAIResponsesModel``; a pydantic-ai ``Agent`` on
``OpenAIChatModel``; LangGraph's ``create_react_agent`` on langchain-openai's ``ChatOpenAI``; a smolagents
``ToolCallingAgent`` on ``OpenAIServerModel`` (roll_async.testing.framework_agents). Each framework sends its
own re-serialisation of the tool-call turn back (pydantic-ai: compact JSON arguments; smolagents: a
``Calling tools:`` text) and each episode must stay one token-exact segment. No Ray, no vLLM engine, no
network: the Agents SDK's tracing is off. The frameworks are the ``agents`` extra (scripts/setup.sh installs it).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from test_agent_tools import agent_config, scripted  # noqa: E402

from roll_async import metrics as rollout_metrics  # noqa: E402
from roll_async.model.families import FAMILIES  # noqa: E402
from roll_async.testing.family_tokenizers import build_family_test_tokenizer  # noqa: E402
from tests.unit.agent_gateway.test_agent_sessions import play_one  # noqa: E402

#: Framework -> (its agent, how many of its calls echo the tool-call turn re-serialised, not byte-equal).
FRAMEWORKS = {
    "agents_sdk": ("agents_sdk_chat_agent", 0),
    "pydantic_ai": ("roll_async.testing.framework_agents:pydantic_ai_agent", 1),
    "langgraph": ("roll_async.testing.framework_agents:langgraph_agent", 0),
    "smolagents": ("roll_async.testing.framework_agents:smolagents_agent", 1),
}
#: smolagents' ToolCallingAgent finishes only through its final_answer tool.
FINAL_ANSWER_CALL = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "sunny"}}\n</tool_call>'
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


async def run_framework(framework: str):
    """One episode of the framework's agent on qwen2_5's template: its engine prompts and outputs."""
    agent, _ = FRAMEWORKS[framework]
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids(FAMILIES["qwen2_5"].eos_token)
    engine, outs = scripted(tokenizer, "qwen2_5")
    config = agent_config(agent)
    if framework == "smolagents":
        outs[1] = tokenizer.encode(FINAL_ANSWER_CALL, add_special_tokens=False) + [eos]
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    return trajectory, engine, outs


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_framework_agent_s_tool_episode_is_one_token_exact_segment(framework):
    trajectory, engine, outs = await run_framework(framework)
    got = trajectory.metrics
    assert got["tool_ran_for_paris"] == 1.0  # the tool ran with the parsed arguments
    assert got["finished_sunny"] == 1.0  # the framework finished on the second reply
    assert got["model_calls"] == 2.0 and got["agent_calls"] == 2.0
    assert got["agent_segment_breaks"] == 0.0
    assert got["agent_dropped_generated_tokens"] == 0.0
    assert got["agent_echoes_by_meaning"] == FRAMEWORKS[framework][1]
    p0, p1 = engine.prompts
    assert (
        p1[: len(p0) + len(outs[0])] == p0 + outs[0]
    )  # the tool-call reply as generated
    assert trajectory.token_ids == p1 + outs[1]
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == outs[0] + outs[1]


async def test_compactly_re_serialised_arguments_keep_one_segment_and_a_rewrite_breaks():
    """The raw openai client echoing pydantic-ai's way (``{"city":"Paris"}`` for ``{"city": "Paris"}``) keeps
    every generated id in training; before the comparison by meaning this started a segment and dropped call
    1's tokens. Echoing other arguments (``{"city":"Rome"}``) is a rewrite: a counted break, as before."""
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine, outs = scripted(tokenizer, "qwen2_5")
    plain, _ = await play_one(agent_config("tool_agent"), engine, tokenizer)
    engine2, _ = scripted(tokenizer, "qwen2_5")
    compact, _ = await play_one(
        agent_config("reserialising_tool_agent"), engine2, tokenizer
    )
    assert compact.stop_reason == "terminated", compact.error
    assert compact.metrics["agent_segment_breaks"] == 0.0
    assert compact.metrics["agent_dropped_generated_tokens"] == 0.0
    assert compact.metrics["agent_echoes_by_meaning"] == 1.0
    assert engine2.prompts == engine.prompts and compact.token_ids == plain.token_ids
    batch_metrics = rollout_metrics.rollout_metrics([compact], step=0)
    assert batch_metrics[rollout_metrics.AGENT_ECHOES_BY_MEANING] == 1.0

    engine3, _ = scripted(tokenizer, "qwen2_5")
    config = agent_config("reserialising_tool_agent")
    config.custom_envs["Agent"].env_config = {"rewrite_city": "Rome"}
    rewritten, _ = await play_one(config, engine3, tokenizer)
    assert rewritten.metrics["agent_segment_breaks"] == 1.0
    assert rewritten.metrics["agent_dropped_generated_tokens"] == len(outs[0])
    assert rewritten.metrics["agent_echoes_by_meaning"] == 0.0
    assert "Rome" in tokenizer.decode(
        engine3.prompts[1]
    )  # the rewrite was rendered afresh
    assert rewritten.token_ids[: len(engine3.prompts[1])] == engine3.prompts[1]


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
