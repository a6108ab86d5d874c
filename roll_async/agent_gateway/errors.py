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
