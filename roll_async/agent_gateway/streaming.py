"""Server-sent chunks for ``stream: true``: a served reply cut into the OpenAI ``chat.completion.chunk`` sequence (role, content, one delta per tool call, finish reason, optional usage); the reply is generated whole first (the non-streaming path's token bookkeeping, parse and counters), so streaming changes how the agent reads a reply, never what is trained on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from roll_async.agent_gateway.session import Reply, usage


def chat_chunks(
    reply: Reply, *, completion_id: str, model: str, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of one reply, in order."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            ],
            **({"usage": None} if include_usage else {}),
        }

    message = reply.message
    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": call["function"]["arguments"],
                        },
                    }
                ]
            }
        )
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(reply),
        }


def sse(event: dict[str, Any], name: str | None = None) -> bytes:
    """One server-sent event (``event:`` line only when named, as the Responses API sends them)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"
