"""One agent episode's chat-completions state: token-in/token-out across calls, segments when history is rewritten.

Agent code sends whole message lists, but training needs the exact ids the
engine saw and generated; a session extends its ids while calls only append,
starts a new segment when the agent rewrites history, and refuses what the
trainer could not reproduce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trajectory import TurnRecord

_ROLES = ("system", "user", "assistant", "tool", "developer")
_UNSUPPORTED_NONZERO = ("presence_penalty", "frequency_penalty")


class OpenAIError(Exception):
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


@dataclass
class Sampling:
    """Per-call sampling from the request (None: the config's value)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


class GenerationLike(Protocol):
    """One call's engine output (the EnvManager's generation of a turn)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_versions: list[int]

    def turn_record(self, turn: int, action_text: str) -> TurnRecord: ...


#: (prompt ids, max new tokens, sampling, call index) -> the engine's generation for that call.
GenerateFn = Callable[[list[int], int, Sampling, int], Awaitable[GenerationLike]]


@dataclass
class Segment:
    """A run of calls that extend one another: one token-exact conversation."""

    token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    #: The last call's messages (normalised) and the reply text it was given.
    messages: list[dict[str, str]] = field(default_factory=list)
    reply: str = ""
    last_generated: list[int] = field(default_factory=list)

    def append(
        self, ids: list[int], *, generated: bool, logprobs: list[float] | None = None
    ) -> None:
        self.token_ids.extend(ids)
        self.response_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(
            logprobs if generated and logprobs is not None else [0.0] * len(ids)
        )

    @property
    def generated_tokens(self) -> int:
        return int(sum(self.response_mask))


class AgentSession:
    """The chat-completions endpoint of one episode (see the module docstring).

    A call *extends* the conversation when its messages are exactly the previous
    call's messages, then the assistant reply that call returned (role and text),
    then one or more non-assistant messages. Its prompt is then the previous
    prompt ids + the generated ids as the engine returned them + the template's
    turn closure + the template delta for the new messages
    (``ChatPromptBuilder.closure_ids_after`` and ``continuation_ids``): nothing is
    re-rendered. Any other call (the agent edited, dropped or summarised history,
    or changed the reply text) starts a new *segment* whose prompt is the template
    render of its messages; ``segment_breaks`` counts these.

    Only the last segment becomes the trajectory (see docs/architecture.md "Agent
    sessions"); earlier segments are kept here for the counts.

    Requests the session cannot serve faithfully raise :class:`OpenAIError`, which
    the server turns into an OpenAI-style error response: tools/function calling,
    ``n`` > 1, streaming, penalties and logit bias (the trainer could not reproduce
    the behaviour logprobs), non-text content, a model id that is not the served
    one. When the episode's limits are reached (``max_steps`` calls, or no room
    left under ``sequence_length``) the call gets an error too and the session
    records why, so the episode ends with that stop reason.
    """

    def __init__(
        self,
        session_id: str,
        prompts: ChatPromptBuilder,
        generate: GenerateFn,
        *,
        model_name: str,
        max_tokens_per_step: int,
        sequence_length: int,
        max_calls: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_id = session_id
        self.prompts = prompts
        self._generate = generate
        self.model_name = model_name
        self.max_tokens_per_step = max_tokens_per_step
        self.sequence_length = sequence_length
        self.max_calls = max_calls
        self._clock = clock
        self.segments: list[Segment] = []
        self.segment_breaks = 0
        self.calls = 0
        #: ``max_steps`` or ``max_length`` once a limit refused a call.
        self.limit_reason: str | None = None
        self.busy = False
        #: An engine failure (after retries) seen while serving; ends the rollout loop like any engine failure.
        self.engine_error: Exception | None = None
        self.last_activity = clock()
        self._lock = asyncio.Lock()
        self._in_flight: set[asyncio.Task] = set()
        self.closed = False

    # -- the endpoint ------------------------------------------------------------------

    async def chat_completion(self, body: Any) -> dict[str, Any]:
        """Serve one ``POST /v1/chat/completions`` body; raises OpenAIError for what cannot be served."""
        messages, max_tokens, sampling = self._parse_request(body)
        async with self._lock:  # calls of one session are served in order
            if self.closed:
                raise OpenAIError(
                    409, "this agent session has ended", code="session_closed"
                )
            task = asyncio.current_task()
            if task is not None:
                self._in_flight.add(task)
            self.busy = True
            try:
                return await self._serve(messages, max_tokens, sampling)
            finally:
                self.busy = False
                self.last_activity = self._clock()
                if task is not None:
                    self._in_flight.discard(task)

    def close(self) -> None:
        """End the session: later calls are refused and an in-flight generation is cancelled (its request aborted)."""
        self.closed = True
        for task in list(self._in_flight):
            task.cancel()

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "roll-async",
        }

    # -- token bookkeeping -------------------------------------------------------------

    async def _serve(
        self, messages: list[dict[str, str]], max_tokens: int | None, sampling: Sampling
    ) -> dict[str, Any]:
        if self.calls >= self.max_calls:
            self.limit_reason = "max_steps"
            raise OpenAIError(
                400,
                f"this episode allows {self.max_calls} model calls (custom_envs.<tag>.max_steps)",
                code="max_steps_exceeded",
            )
        segment = self.segments[-1] if self.segments else None
        new_messages = self._extension(segment, messages)
        now = self._clock()
        starts_segment = segment is None or new_messages is None
        if not starts_segment:
            prompt_delta = self.prompts.closure_ids_after(
                segment.last_generated
            ) + self.prompts.continuation_ids(new_messages)
            previous = segment.turns[-1]
            previous.observation = "\n".join(m["content"] for m in new_messages)
            previous.env_step_s = now - self.last_activity
            prompt = segment.token_ids + prompt_delta
        else:
            segment, prompt_delta = (
                Segment(),
                self.prompts.render_ids(messages, add_generation_prompt=True),
            )
            prompt = list(prompt_delta)
        budget = self.sequence_length - len(prompt)
        if budget <= 0:
            self.limit_reason = "max_length"
            raise OpenAIError(
                400,
                f"the conversation ({len(prompt)} tokens) leaves no room under sequence_length={self.sequence_length}",
                code="context_length_exceeded",
                param="messages",
            )
        limit = min(self.max_tokens_per_step, budget)
        try:
            generation = await self._generate(
                prompt,
                min(max_tokens, limit) if max_tokens else limit,
                sampling,
                self.calls,
            )
        except Exception as exc:  # the engine failed after its retries: the episode runner re-raises it
            self.engine_error = exc
            raise
        if starts_segment:
            self.segment_breaks += 1 if self.segments else 0
            self.segments.append(segment)
            segment.prompt_length = len(prompt_delta)
        segment.append(prompt_delta, generated=False)
        segment.append(
            generation.token_ids, generated=True, logprobs=generation.logprobs
        )
        segment.weight_versions.extend(generation.weight_versions)
        text = self._reply_text(
            generation.token_ids, generation.finish_reason, sampling.stop
        )
        segment.turns.append(generation.turn_record(len(segment.turns), text))
        segment.messages, segment.reply, segment.last_generated = (
            messages,
            text,
            list(generation.token_ids),
        )
        self.calls += 1
        finish = "length" if generation.finish_reason == "length" else "stop"
        return {
            "id": f"chatcmpl-{self.session_id}-{self.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generation.token_ids),
                "total_tokens": len(prompt) + len(generation.token_ids),
            },
        }

    @staticmethod
    def _extension(
        segment: Segment | None, messages: list[dict[str, str]]
    ) -> list[dict[str, str]] | None:
        """The new messages when ``messages`` extends the segment's last call, else None (a new segment)."""
        if segment is None or not segment.turns:
            return None
        head = segment.messages + [{"role": "assistant", "content": segment.reply}]
        if len(messages) <= len(head) or messages[: len(head)] != head:
            return None
        new = messages[len(head) :]
        return None if any(m["role"] == "assistant" for m in new) else new

    def _reply_text(
        self, token_ids: list[int], finish_reason: str, stop: list[str]
    ) -> str:
        """The reply as the OpenAI API gives it: special tokens dropped, a matched stop string removed."""
        text = self.prompts.decode(token_ids)
        if finish_reason == "stop":
            for s in stop:
                if s and text.endswith(s):
                    return text[: -len(s)]
        return text

    # -- request checks ----------------------------------------------------------------

    def _parse_request(
        self, body: Any
    ) -> tuple[list[dict[str, str]], int | None, Sampling]:
        if not isinstance(body, dict):
            raise OpenAIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model != self.model_name:
            raise OpenAIError(
                404,
                f"the model {model!r} is not served here; the served model is {self.model_name!r} (GET /v1/models)",
                code="model_not_found",
                param="model",
            )
        if body.get("tools") or body.get("functions"):
            raise OpenAIError(
                400,
                "tools / function calling are not supported by the roll-async agent endpoint; "
                "describe actions in the messages and parse the reply",
                param="tools",
            )
        if body.get("n") not in (None, 1):
            raise OpenAIError(
                400,
                f"n={body.get('n')} is not supported; roll-async generates one choice per call (n=1)",
                param="n",
            )
        if body.get("stream"):
            raise OpenAIError(
                400,
                "stream=true is not supported by the roll-async agent endpoint",
                param="stream",
            )
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
        response_format = body.get("response_format")
        if response_format and (
            not isinstance(response_format, dict)
            or response_format.get("type") != "text"
        ):
            raise OpenAIError(
                400,
                "response_format other than text is not supported",
                param="response_format",
            )
        messages = self._parse_messages(body.get("messages"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise OpenAIError(
                400,
                f"max_tokens={max_tokens!r} must be a positive integer",
                param="max_tokens",
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise OpenAIError(
                400, "stop must be a string or a list of strings", param="stop"
            )
        sampling = Sampling(
            temperature=_number(body, "temperature", 0.0, 2.0),
            top_p=_number(body, "top_p", 0.0, 1.0),
            top_k=int(body["top_k"]) if isinstance(body.get("top_k"), int) else None,
            stop=stop,
            seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
        )
        return messages, max_tokens, sampling

    @staticmethod
    def _parse_messages(raw: Any) -> list[dict[str, str]]:
        if not isinstance(raw, list) or not raw:
            raise OpenAIError(
                400, "messages must be a non-empty list", param="messages"
            )
        messages = []
        for i, message in enumerate(raw):
            if not isinstance(message, dict) or message.get("role") not in _ROLES:
                raise OpenAIError(
                    400,
                    f"messages[{i}] needs a role among {list(_ROLES)}",
                    param="messages",
                )
            if message.get("tool_calls"):
                raise OpenAIError(
                    400,
                    f"messages[{i}] carries tool_calls; tool calling is not supported",
                    param="messages",
                )
            content = message.get("content")
            if isinstance(content, list):  # content parts: text only
                parts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") != "text":
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
                raise OpenAIError(
                    400, f"messages[{i}].content must be text", param="messages"
                )
            role = "system" if message["role"] == "developer" else message["role"]
            messages.append({"role": role, "content": content})
        return messages


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
