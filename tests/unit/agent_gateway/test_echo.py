"""Echoed history compared by meaning (roll_async.agent_gateway.echo): the re-serialisations agent frameworks
do are the same turn, genuine rewrites are not. Pure functions over normalised messages (parse_messages)."""

from __future__ import annotations

import json

from roll_async.agent_gateway.chat_request import parse_messages
from roll_async.agent_gateway.echo import compare_history, same_turn

USER = {"role": "user", "content": "What is 2 + 3?"}


def call(call_id: str, arguments: str, name: str = "add") -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


#: The reply as the endpoint returned it (arguments as the tool parser wrote them).
RETURNED = {
    "role": "assistant",
    "content": "",
    "tool_calls": [call("call00000", '{"a": 2, "b": 3}')],
}


def history(assistant: dict) -> list[dict]:
    """Normalised messages as a session sees them: the user turn, then the echoed assistant turn."""
    return parse_messages([USER, assistant])


def expected() -> list[dict]:
    return [dict(USER), RETURNED]


def test_byte_equal_history_is_exact():
    assert compare_history(history(RETURNED), expected()) == "exact"


def test_re_serialised_arguments_content_and_order_are_the_same_turn():
    """pydantic-ai's compact JSON, keys reordered, content None for "", whitespace the templates trim."""
    compact = {**RETURNED, "tool_calls": [call("call00000", '{"b":3,"a":2}')]}
    assert compare_history(history(compact), expected()) == "meaning"
    as_object = {  # a client that sends arguments as an object
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call00000",
                "function": {"name": "add", "arguments": {"b": 3, "a": 2}},
            }
        ],
    }
    assert compare_history(history(as_object), expected()) == "meaning"
    text = {"role": "assistant", "content": "Five."}
    assert same_turn({"role": "assistant", "content": "  Five.\n"}, text)
    two = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("c1", '{"a": 1}'), call("c2", '{"a": 2}')],
    }
    swapped = {**two, "tool_calls": [call("c2", '{"a":2}'), call("c1", '{"a":1}')]}
    assert same_turn(swapped, two)


def test_smolagents_calling_tools_text_is_the_same_turn():
    """smolagents sends a tool-call turn back as text: ``Calling tools:`` + the calls as a Python literal."""
    calls = [
        {
            "id": "call00000",
            "type": "function",
            "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
        }
    ]
    echoed = {"role": "assistant", "content": "Calling tools:\n" + str(calls)}
    assert compare_history(history(echoed), expected()) == "meaning"
    with_text = {**RETURNED, "content": "Let me add.\n"}
    echoed_text = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me add.\nCalling tools:\n" + str(calls)}
        ],
    }
    assert same_turn(parse_messages([USER, echoed_text])[1], with_text)
    assert not same_turn(echoed_text | {"content": "Calling tools:\n[oops"}, RETURNED)


def test_genuine_rewrites_differ():
    rewrites = {
        "other arguments": {
            **RETURNED,
            "tool_calls": [call("call00000", '{"a":2,"b":4}')],
        },
        "int for float": {
            **RETURNED,
            "tool_calls": [call("call00000", '{"a":2.0,"b":3}')],
        },
        "other function": {
            **RETURNED,
            "tool_calls": [call("call00000", '{"a": 2, "b": 3}', name="sub")],
        },
        "other id": {**RETURNED, "tool_calls": [call("call_x", '{"a": 2, "b": 3}')]},
        "call dropped": {"role": "assistant", "content": ""},
        "call added": {
            **RETURNED,
            "tool_calls": RETURNED["tool_calls"] + [call("call00001", "{}")],
        },
        "content added": {**RETURNED, "content": "I will add."},
        "smolagents text, other args": {
            "role": "assistant",
            "content": "Calling tools:\n"
            + str(
                [
                    {
                        "id": "call00000",
                        "function": {"name": "add", "arguments": {"a": 9}},
                    }
                ]
            ),
        },
    }
    for why, message in rewrites.items():
        assert compare_history(history(message), expected()) == "differs", why
    changed_user = parse_messages([{**USER, "content": "What is 2 + 4?"}, RETURNED])
    assert compare_history(changed_user, expected()) == "differs"
    assert compare_history(history(RETURNED)[:1], expected()) == "differs"
    text = {"role": "assistant", "content": "Five."}
    assert not same_turn({"role": "assistant", "content": "Six."}, text)
    assert json.loads(RETURNED["tool_calls"][0]["function"]["arguments"]) == {
        "a": 2,
        "b": 3,
    }  # the fixture itself is unchanged by the comparisons
