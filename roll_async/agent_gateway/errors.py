"""The error every agent-gateway route answers with: an OpenAI-style ``{"error": {...}}`` body and a 4xx/5xx status, so the openai client raises its usual ``APIStatusError`` and never hangs."""

from __future__ import annotations

from typing import Any

from roll_async.errors import RollAsyncError


class OpenAIError(RollAsyncError):
    """An error the gateway answers with ``{"error": {...}}`` and ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status,
            message,
            type,
            code,
            param,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def context_length_exceeded(sequence_length: int, prompt_tokens: int) -> OpenAIError:
    """The 400 for a call whose conversation leaves no room under ``sequence_length``.

    Worded and coded as OpenAI's own (``context_length_exceeded``, "This model's maximum context length
    is ..."), which client libraries such as litellm map to their context-window error: a harness then
    trims its history or stops instead of retrying a call that can never be served.
    """
    return OpenAIError(
        400,
        f"This model's maximum context length is {sequence_length} tokens (sequence_length); "
        f"the conversation ({prompt_tokens} tokens) leaves no room for a reply",
        code="context_length_exceeded",
        param="messages",
    )
