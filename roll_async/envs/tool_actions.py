"""The action a tool-using env receives: the model's parsed function calls as one JSON text, so they cross every wire an action crosses (threads, env processes, env servers) unchanged; an env declares OpenAI function tools in ``tools()`` (``BaseEnv.reset`` puts them in ``info["tools"]``), the rollout renders them through the chat template, parses each reply with the model's tool parser and calls ``step`` with :func:`encode_tool_calls` of the calls (or the raw reply when it made none: a format error for the env)."""

from __future__ import annotations

import json
from typing import Any

#: The key of the JSON object :func:`encode_tool_calls` writes.
TOOL_CALLS_KEY = "tool_calls"


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """An OpenAI function tool with an object schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
            },
        },
    }


def encode_tool_calls(calls: list[dict[str, Any]]) -> str:
    """``{"tool_calls": [{"name", "arguments": {...}}]}`` from OpenAI tool calls (arguments as JSON text)."""
    plain = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments") or "{}"
        plain.append(
            {
                "name": function["name"],
                "arguments": json.loads(arguments)
                if isinstance(arguments, str)
                else arguments,
            }
        )
    return json.dumps({TOOL_CALLS_KEY: plain}, ensure_ascii=False)


def decode_tool_calls(action_text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The (name, arguments) calls of an action from :func:`encode_tool_calls`; None for any other text."""
    text = (action_text or "").strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    calls = data.get(TOOL_CALLS_KEY) if isinstance(data, dict) else None
    if not isinstance(calls, list):
        return None
    return [
        (str(c.get("name", "")), c.get("arguments") or {})
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("arguments") or {}, dict)
    ]
