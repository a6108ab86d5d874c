"""``/v1/responses`` with ``stream: true`` as OpenAI streams it: the real openai client and aiohttp gateway, a FAKE
engine (no model) whose output is a fixed token sequence per call.

The client's accumulated snapshot (what ``client.responses.stream`` hands an agent) must hold the generated
text exactly once; an agent that echoes it back then extends the same token sequence (no new segment).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from roll_async.testing.agents import TOOL_CALL_REPLIES, WEATHER_TOOL
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.family_tokenizers import build_family_test_tokenizer
from tests.unit.agent_gateway.test_agent_sessions import agent_config, play_one

pytest.importorskip("openai")

TEXT = "Hello there, general."
#: What the agents below saw, keyed by agent name (the agents run in this process).
SEEN: dict[str, dict[str, Any]] = {}
#: OpenAI's event order for one text message, ending in the completed response.
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def echoing_stream_agent(client: Any, task: Any) -> dict:
    """Streams one reply with ``responses.stream``, then sends the snapshot back as the assistant's turn."""
    items: list[Any] = [{"role": "user", "content": "Say hello."}]
    snapshots: list[str] = []
    async with client.responses.stream(
        model=task.model, input=items, max_output_tokens=64
    ) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                snapshots.append(event.snapshot)
        final = await stream.get_final_response()
    SEEN["echo"] = {"snapshots": snapshots, "final": final.output_text}
    items += [
        {"role": "assistant", "content": snapshots[-1]},
        {"role": "user", "content": "Again."},
    ]
    await client.responses.create(model=task.model, input=items, max_output_tokens=64)
    return {"reward": 1.0}


async def raw_events_agent(client: Any, task: Any) -> dict:
    """``responses.create(stream=True)``: the raw events as they came."""
    stream = await client.responses.create(
        model=task.model, input="Say hello.", max_output_tokens=64, stream=True
    )
    SEEN["raw"] = {"events": [event async for event in stream]}
    return {"reward": 1.0}


async def streaming_tool_call_agent(client: Any, task: Any) -> dict:
    """A streamed function call: the argument snapshots and the final item."""
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    arguments: list[str] = []
    kinds: list[str] = []
    async with client.responses.stream(
        model=task.model, input="Weather in Paris?", tools=[tool], max_output_tokens=64
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                arguments.append(event.snapshot)
        final = await stream.get_final_response()
    SEEN["tool"] = {"arguments": arguments, "kinds": kinds, "final": final}
    return {"reward": 1.0}


def config_for(agent: str):
    config = agent_config("three_turn_agent")
    config.custom_envs["Agent"].agent = f"{__name__}:{agent}"
    config.custom_envs["Agent"].max_tokens_per_step = 64
    return config


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def text_engine(tokenizer) -> FakeEngine:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    return FakeEngine(lambda request: ids + [tokenizer.eos_token_id])


async def test_the_stream_snapshot_holds_the_text_once_and_echoing_it_extends_the_trajectory(
    tokenizer,
):
    trajectory, _ = await play_one(
        config_for("echoing_stream_agent"), text_engine(tokenizer), tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    seen = SEEN["echo"]
    assert seen["snapshots"][-1] == TEXT and seen["final"] == TEXT
    assert trajectory.metrics["agent_segment_breaks"] == 0.0


async def test_the_raw_events_come_in_openai_s_order_with_empty_items_first(tokenizer):
    trajectory, _ = await play_one(
        config_for("raw_events_agent"), text_engine(tokenizer), tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    events = SEEN["raw"]["events"]
    assert [e.type for e in events] == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    by_type = {e.type: e for e in events}
    added = by_type["response.output_item.added"].item
    assert added.type == "message" and added.content == []
    assert added.status == "in_progress"
    assert by_type["response.content_part.added"].part.text == ""
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == TEXT
    assert by_type["response.output_text.done"].text == TEXT
    assert by_type["response.content_part.done"].part.text == TEXT
    done = by_type["response.output_item.done"].item
    assert done.status == "completed" and done.content[0].text == TEXT
    item_ids = {
        e.item_id
        for e in events
        if e.type.startswith(("response.content_part", "response.output_text"))
    }
    assert item_ids == {added.id} == {done.id}
    assert by_type["response.completed"].response.output_text == TEXT


async def test_a_streamed_function_call_s_arguments_arrive_once():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = tokenizer.encode(TOOL_CALL_REPLIES["qwen2_5"], add_special_tokens=False)
    engine = FakeEngine(lambda request: call + [eos])
    config = config_for("streaming_tool_call_agent")
    config.custom_envs["Agent"].env_config = {}
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    seen = SEEN["tool"]
    assert seen["kinds"][:3] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert "response.function_call_arguments.done" in seen["kinds"]
    assert seen["kinds"][-2:] == ["response.output_item.done", "response.completed"]
    (item,) = seen["final"].output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == {"city": "Paris"}
    assert seen["arguments"] and seen["arguments"][-1] == item.arguments
