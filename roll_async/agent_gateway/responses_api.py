"""The Responses API (``POST /v1/responses``) over the same session: its input items become chat messages and its output items come from the same reply, so an agent on the Responses API (e.g. the OpenAI Agents SDK's default model class) gets the same token-exact trajectory as one on chat completions; stateless, every call carries its whole input (``previous_response_id`` and stored conversations are refused with a 400 naming the parameter)."""

from __future__ import annotations

import time
from typing import Any

from roll_async.agent_gateway.chat_request import (
    ChatRequest,
    check_model,
    check_reproducible,
    parse_messages,
    parse_sampling,
    positive_int,
)
from roll_async.agent_gateway.errors import OpenAIError
from roll_async.agent_gateway.session import Reply
from roll_async.agent_gateway.tool_calls import parse_tool_request

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def parse_responses_request(body: Any, model_name: str) -> ChatRequest:
    """A ``POST /v1/responses`` body as a chat request; OpenAIError names what cannot be served."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    check_model(body, model_name)
    if body.get("previous_response_id"):
        raise OpenAIError(
            400,
            "previous_response_id is not supported: the roll-async endpoint is stateless; "
            "send the whole conversation as input (store=false)",
            param="previous_response_id",
        )
    if body.get("conversation"):
        raise OpenAIError(
            400,
            "conversation is not supported: send the whole conversation as input",
            param="conversation",
        )
    check_reproducible(body)
    text_format = (
        (body.get("text") or {}).get("format")
        if isinstance(body.get("text"), dict)
        else None
    )
    if text_format and text_format.get("type") != "text":
        raise OpenAIError(
            400,
            "text.format other than text (structured outputs) is not supported: "
            "the trainer could not reproduce constrained logprobs",
            param="text.format",
        )
    tools = parse_tool_request(
        {
            "tools": _chat_tools(body.get("tools")),
            "tool_choice": body.get("tool_choice"),
        }
    )
    messages = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    messages += _input_messages(body.get("input"))
    return ChatRequest(
        parse_messages(messages),
        max_tokens=positive_int(body, ("max_output_tokens",)),
        sampling=parse_sampling({k: body.get(k) for k in ("temperature", "top_p")}),
        tools=tools,
        stream=bool(body.get("stream")),
    )


def _chat_tools(raw: Any) -> Any:
    """Responses function tools (flat) in the chat-completions form; other tool types are refused."""
    if not raw:
        return raw
    if not isinstance(raw, list):
        raise OpenAIError(400, "tools must be a list", param="tools")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise OpenAIError(
                400,
                f"tools[{i}] has type {kind!r}; only function tools are served "
                "(hosted tools such as web_search or file_search are not)",
                param="tools",
            )
        function = {
            k: tool[k] for k in ("name", "description", "parameters") if k in tool
        }
        tools.append({"type": "function", "function": function})
    return tools


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    """Input items as chat messages: function_call items join the assistant message before them."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise OpenAIError(
            400, "input must be a string or a non-empty list of items", param="input"
        )
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in _MESSAGE_ROLES:
            messages.append({"role": item["role"], "content": item.get("content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {
                    "name": item.get("name"),
                    "arguments": item.get("arguments", "{}"),
                },
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = "".join(
                    str(p.get("text", "")) for p in output if isinstance(p, dict)
                )
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
        else:
            raise OpenAIError(
                400,
                f"input[{i}] of type {kind!r} is not supported; the endpoint serves message, "
                "function_call and function_call_output items",
                param="input",
            )
    return messages


def response_body(
    reply: Reply, *, response_id: str, model: str, body: dict[str, Any]
) -> dict[str, Any]:
    """A reply as a ``response`` object: a message item (text) and one function_call item per call."""
    message = reply.message
    output: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": message.get("content") or "",
                        "annotations": [],
                    }
                ],
            }
        )
    for call in message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call['id']}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    truncated = reply.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def response_events(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The streamed form of a finished response, in the order and shape OpenAI streams it.

    ``created`` and ``in_progress`` (no output yet); per output item ``output_item.added`` with the item
    empty (a message without content, a call without arguments), its content arriving only as deltas
    (message: ``content_part.added`` with empty text, ``output_text.delta``, ``output_text.done``,
    ``content_part.done``; call: ``function_call_arguments.delta`` and ``.done``), then
    ``output_item.done`` with the whole item; last ``completed`` (or ``incomplete``) with the response.
    A client that accumulates the stream (the openai client's snapshot) thus holds each text once.
    """
    events: list[dict[str, Any]] = []
    in_progress = {**response, "status": "in_progress", "output": [], "usage": None}
    events.append({"type": "response.created", "response": in_progress})
    events.append({"type": "response.in_progress", "response": in_progress})
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            events += _message_events(item, index, where)
        else:
            events += _function_call_events(item, index, where)
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": item}
        )
    kind = (
        "response.incomplete"
        if response["status"] == "incomplete"
        else "response.completed"
    )
    events.append({"type": kind, "response": response})
    return [
        (event["type"], {**event, "sequence_number": n})
        for n, event in enumerate(events)
    ]


def _message_events(
    item: dict[str, Any], index: int, where: dict[str, Any]
) -> list[dict[str, Any]]:
    """A message item's events before its ``output_item.done``: empty item, empty part, text as a delta."""
    text = item["content"][0]["text"]
    part = {"type": "output_text", "text": "", "annotations": []}
    at = {**where, "content_index": 0}
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **at, "part": part},
    ]
    if text:
        events.append(
            {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []}
        )
    events += [
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": {**part, "text": text}},
    ]
    return events


def _function_call_events(
    item: dict[str, Any], index: int, where: dict[str, Any]
) -> list[dict[str, Any]]:
    """A function_call item's events before its ``output_item.done``: no arguments, then them as a delta."""
    arguments = item["arguments"]
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "arguments": ""},
        }
    ]
    if arguments:
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                **where,
                "delta": arguments,
            }
        )
    events.append(
        {
            "type": "response.function_call_arguments.done",
            **where,
            "arguments": arguments,
        }
    )
    return events
