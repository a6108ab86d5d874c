"""Whether the history an agent sends back means what the session returned: echoed assistant turns compared by meaning, not by bytes.

Agent frameworks keep their own history and re-serialise what the endpoint returned before sending it
back: pydantic-ai writes tool-call arguments compactly (``{"city":"Paris"}`` for the returned
``{"city": "Paris"}``), smolagents turns the calls into a ``Calling tools:`` text and strips the content,
templates trim whitespace anyway. When a call extends a segment the echoed assistant message is never
rendered (the segment keeps the ids the engine generated), so the only question is whether the agent
means the same turn; a byte comparison would start a new segment and drop every earlier generated token
from training. A genuine rewrite (other content, other calls, other arguments) still differs.
"""

from __future__ import annotations

import ast
import json
from typing import Any, Literal

from roll_async.agent_gateway.chat_request import (
    Message,
    normalise_tool_calls,
    parsed_arguments,
)
from roll_async.agent_gateway.errors import OpenAIError

__all__ = ["EchoMatch", "compare_history", "same_turn"]

#: How sent history compares with the expected one: byte-equal, equal by meaning, or a rewrite.
EchoMatch = Literal["exact", "meaning", "differs"]

#: smolagents echoes a tool-call turn as this text followed by the calls as a Python literal list
#: (``ActionStep.to_messages``: ``"Calling tools:\n" + str([call.dict() ...])``), sent as assistant content.
SMOLAGENTS_CALLS_PREFIX = "Calling tools:\n"


def compare_history(sent: list[Message], expected: list[Message]) -> EchoMatch:
    """``exact`` when the normalised messages are equal, ``meaning`` when only assistant turns differ and each
    means the same turn (:func:`same_turn`), else ``differs``. Other roles must be equal: a changed user or
    tool message is a rewrite."""
    if sent == expected:
        return "exact"
    if len(sent) != len(expected):
        return "differs"
    for got, want in zip(sent, expected):
        if got == want:
            continue
        if got["role"] != "assistant" or want["role"] != "assistant":
            return "differs"
        if not same_turn(got, want):
            return "differs"
    return "meaning"


def same_turn(echoed: Message, returned: Message) -> bool:
    """Whether two assistant messages are the same turn: content equal up to surrounding whitespace, and the
    same tool calls (matched by id, in any order) with the same name and arguments equal as parsed JSON."""
    echoed_content, echoed_calls = _content_and_calls(echoed)
    content, calls = _content_and_calls(returned)
    if echoed_content.strip() != content.strip() or len(echoed_calls) != len(calls):
        return False
    by_id = {call["id"]: call for call in calls}
    if len(by_id) != len(calls) or {c["id"] for c in echoed_calls} != set(by_id):
        return False
    return all(
        call["function"]["name"] == by_id[call["id"]]["function"]["name"]
        and _canonical(call["function"]["arguments"])
        == _canonical(by_id[call["id"]]["function"]["arguments"])
        for call in echoed_calls
    )


def _content_and_calls(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """A normalised assistant message's text and calls; smolagents' ``Calling tools:`` text read back as calls."""
    content: str = message.get("content") or ""
    calls: list[dict[str, Any]] = message.get("tool_calls") or []
    if not calls:
        at = content.rfind(SMOLAGENTS_CALLS_PREFIX)
        if at >= 0:
            literal = _literal_calls(content[at + len(SMOLAGENTS_CALLS_PREFIX) :])
            if literal:
                return content[:at], literal
    return content, calls


def _literal_calls(text: str) -> list[dict[str, Any]] | None:
    """Calls written as a Python literal list of ``{id, type, function: {name, arguments}}``; None otherwise."""
    try:
        raw = ast.literal_eval(text.strip())
        return normalise_tool_calls(raw, 0)
    except (
        ValueError,
        SyntaxError,
        TypeError,
        MemoryError,
        RecursionError,
        OpenAIError,
    ):
        return None


def _canonical(arguments: str) -> str:
    """Arguments as canonical JSON text (sorted keys, no spaces): equal exactly when the parsed values are."""
    return json.dumps(
        parsed_arguments(arguments),
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
