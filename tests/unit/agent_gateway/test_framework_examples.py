"""examples/agent_frameworks.py (configs/agent_frameworks.yaml) plays FrozenLake through each framework's
``move`` tool as one token-exact trajectory: two scripted moves in the qwen2_5 tool format, then a plain reply
(smolagents: its ``final_answer`` call), on the fake engine. What a user copying an example relies on: the tool
steps the env, the episode ends on the framework's own terms, and no generated token leaves training."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from test_agent_tools import agent_config  # noqa: E402

from roll_async.model.families import FAMILIES  # noqa: E402
from roll_async.testing.fake_engine import FakeEngine  # noqa: E402
from roll_async.testing.family_tokenizers import build_family_test_tokenizer  # noqa: E402
from tests.unit.agent_gateway.test_agent_sessions import play_one  # noqa: E402

EXAMPLES = ["play_agents_sdk", "play_pydantic_ai", "play_langgraph", "play_smolagents"]


def move(direction: str) -> str:
    return f'<tool_call>\n{{"name": "move", "arguments": {{"direction": "{direction}"}}}}\n</tool_call>'


@pytest.mark.parametrize("example", EXAMPLES)
async def test_each_framework_example_plays_the_lake_in_one_token_exact_segment(
    example,
):
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids(FAMILIES["qwen2_5"].eos_token)
    final = (
        '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "done"}}\n</tool_call>'
        if example == "play_smolagents"
        else "done"
    )
    outputs = [
        tokenizer.encode(text, add_special_tokens=False) + [eos]
        for text in (move("Right"), move("Down"), final)
    ]
    engine = FakeEngine()
    engine._output_fn = lambda request: outputs[min(len(engine.requests) - 1, 2)]
    config = agent_config(f"examples.agent_frameworks:{example}")
    config.custom_envs["Agent"].env_config = {"size": 3, "p": 0.8, "is_slippery": False}
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    got = trajectory.metrics
    assert "success" in got  # the agent's own return value, the env's outcome
    assert got["agent_calls"] == 3.0
    assert (
        got["agent_segment_breaks"] == 0.0
        and got["agent_dropped_generated_tokens"] == 0.0
    )
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == outputs[0] + outputs[1] + outputs[2]
    assert "Move one cell" in tokenizer.decode(
        engine.prompts[0]
    )  # the move tool reached the template
