"""A chat-completions request body checked and normalised into what a session serves: messages in one canonical form (so an echoed reply compares equal to the one returned), sampling, tools, streaming; everything the trainer could not reproduce is refused here with an OpenAI-style 400 naming the parameter."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from roll_async.agent_gateway.errors import OpenAIError
from roll_async.agent_gateway.tool_calls import ToolRequest, parse_tool_request

_ROLES = ("system", "user", "assistant", "tool", "developer")
_UNSUPPORTED_NONZERO = ("presence_penalty", "frequency_penalty")

#: A normalised message: role and content (text), plus ``tool_calls`` (assistant) or ``tool_call_id`` (tool).
Message = dict[str, Any]


@dataclass
class Sampling:
    """Per-call sampling from the request (None: the config's value)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class ChatRequest:
    """One call as the session serves it, whichever endpoint it came through."""

    messages: list[Message]
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    tools: ToolRequest | None = None
    stream: bool = False
    include_usage: bool = False


def parse_chat_request(body: Any, model_name: str) -> ChatRequest:
    """Check a ``POST /v1/chat/completions`` body; OpenAIError for what cannot be served."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    check_model(body, model_name)
    check_reproducible(body)
    if body.get("n") not in (None, 1):
        raise OpenAIError(
            400,
            f"n={body.get('n')} is not supported; roll-async generates one choice per call (n=1)",
            param="n",
        )
    response_format = body.get("response_format")
    if response_format and (
        not isinstance(response_format, dict) or response_format.get("type") != "text"
    ):
        raise OpenAIError(
            400,
            "response_format other than text (structured outputs) is not supported: "
            "the trainer could not reproduce constrained logprobs",
            param="response_format",
        )
    tools = parse_tool_request(body)
    messages = parse_messages(body.get("messages"))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise OpenAIError(
            400, "stream_options must be an object", param="stream_options"
        )
    return ChatRequest(
        messages,
        max_tokens=positive_int(body, ("max_completion_tokens", "max_tokens")),
        sampling=parse_sampling(body),
        tools=tools,
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )


def check_model(body: dict[str, Any], model_name: str) -> None:
    model = body.get("model")
    if model != model_name:
        raise OpenAIError(
            404,
            f"the model {model!r} is not served here; the served model is {model_name!r} (GET /v1/models)",
            code="model_not_found",
            param="model",
        )


def check_reproducible(body: dict[str, Any]) -> None:
    """Refuse penalties, logit bias and structured outputs: the trainer could not reproduce their logprobs."""
    for key in _UNSUPPORTED_NONZERO:
        if body.get(key):
            raise OpenAIError(
                400,
                f"{key} is not supported: the trainer could not reproduce penalised logprobs",
                param=key,
            )
    if body.get("logit_bias"):
        raise OpenAIError(
            400,
            "logit_bias is not supported: the trainer could not reproduce biased logprobs",
            param="logit_bias",
        )
    for key in ("guided_json", "guided_regex", "guided_choice", "structured_outputs"):
        if body.get(key):
            raise OpenAIError(
                400,
                f"{key} (structured outputs) is not supported: the trainer could not reproduce constrained logprobs",
                param=key,
            )


def positive_int(body: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    value = next((body[k] for k in keys if body.get(k) is not None), None)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise OpenAIError(
            400, f"{keys[-1]}={value!r} must be a positive integer", param=keys[-1]
        )
    return value


def parse_sampling(body: dict[str, Any]) -> Sampling:
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise OpenAIError(
            400, "stop must be a string or a list of strings", param="stop"
        )
    return Sampling(
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        top_k=int(body["top_k"]) if isinstance(body.get("top_k"), int) else None,
        stop=stop,
        seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
    )


def parse_messages(raw: Any) -> list[Message]:
    """Normalised messages; a ``tool`` message must answer a call of an earlier assistant message."""
    if not isinstance(raw, list) or not raw:
        raise OpenAIError(400, "messages must be a non-empty list", param="messages")
    messages: list[Message] = []
    call_ids: set[str] = set()
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise OpenAIError(
                400,
                f"messages[{i}] needs a role among {list(_ROLES)}",
                param="messages",
            )
        role = "system" if message["role"] == "developer" else message["role"]
        normalised: Message = {"role": role, "content": _text(message, i)}
        if role == "assistant" and message.get("tool_calls"):
            normalised["tool_calls"] = normalise_tool_calls(message["tool_calls"], i)
            call_ids.update(c["id"] for c in normalised["tool_calls"])
        elif message.get("tool_calls"):
            raise OpenAIError(
                400,
                f"messages[{i}] ({role}) carries tool_calls; only assistant messages may",
                param="messages",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in call_ids:
                raise OpenAIError(
                    400,
                    f"messages[{i}].tool_call_id={call_id!r} matches no tool call of an earlier assistant "
                    f"message (calls so far: {sorted(call_ids)})",
                    param="messages",
                )
            normalised["tool_call_id"] = call_id
        messages.append(normalised)
    return messages


def _text(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "text",
                "input_text",
                "output_text",
            ):
                raise OpenAIError(
                    400,
                    f"messages[{i}] has non-text content; only text is supported",
                    param="messages",
                )
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise OpenAIError(400, f"messages[{i}].content must be text", param="messages")
    return content


def normalise_tool_calls(raw: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as ``{id, type, function: {name, arguments: JSON text}}``; OpenAIError names ``messages[i]``."""
    if not isinstance(raw, list):
        raise OpenAIError(
            400, f"messages[{i}].tool_calls must be a list", param="messages"
        )
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(function.get("name"), str)
        ):
            raise OpenAIError(
                400,
                f"messages[{i}].tool_calls entries need id and function.name",
                param="messages",
            )
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def render_form(messages: list[Message]) -> list[Message]:
    """Messages as chat templates expect them: tool-call arguments as objects, not JSON text."""
    rendered = []
    for message in messages:
        if "tool_calls" not in message:
            rendered.append(message)
            continue
        calls = [
            {
                **call,
                "function": {
                    **call["function"],
                    "arguments": parsed_arguments(call["function"]["arguments"]),
                },
            }
            for call in message["tool_calls"]
        ]
        rendered.append({**message, "tool_calls": calls})
    return rendered


def parsed_arguments(arguments: str) -> Any:
    """A tool call's JSON-text arguments as the object they encode (the text itself when it is not JSON)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not low <= float(value) <= high
    ):
        raise OpenAIError(
            400, f"{key}={value!r} must be a number in [{low}, {high}]", param=key
        )
    return float(value)
