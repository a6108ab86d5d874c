"""One agent episode's model-call state: token-in/token-out across calls, segments when history is rewritten.

Agent code sends whole message lists, but training needs the exact ids the
engine saw and generated; a session extends its ids while calls only append
(tool calls and tool results included), starts a new segment when the agent
rewrites history, and refuses what the trainer could not reproduce. Both
endpoints (chat completions, responses) come here as one ``ChatRequest``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.agent_gateway.chat_request import (
    ChatRequest,
    Message,
    Sampling,
    parse_chat_request,
    render_form,
)
from roll_async.agent_gateway.echo import compare_history
from roll_async.agent_gateway.errors import OpenAIError, context_length_exceeded
from roll_async.agent_gateway.tool_calls import (
    ParsedReply,
    ToolCallParser,
    detect_tool_parser,
)
from roll_async.errors import ChatTemplateError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trajectory import TurnRecord

__all__ = ["AgentSession", "OpenAIError", "Reply", "Sampling", "Segment"]


class GenerationLike(Protocol):
    """One call's engine output (the EnvManager's generation of a turn)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_versions: list[int]
    token_versions: list[int]

    def turn_record(self, turn: int, action_text: str) -> TurnRecord: ...


#: (prompt ids, max new tokens, sampling, call index) -> the engine's generation for that call.
GenerateFn = Callable[[list[int], int, Sampling, int], Awaitable[GenerationLike]]


@dataclass
class Segment:
    """A run of calls that extend one another: one token-exact conversation."""

    token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: The weight version that sampled each generated id; -1 on prompt, template and tool-result ids.
    token_versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    #: The last call's messages (normalised) and the assistant message it was given.
    messages: list[Message] = field(default_factory=list)
    reply_message: Message = field(default_factory=dict)
    last_generated: list[int] = field(default_factory=list)
    #: The tools the segment's prompt declares (JSON text; "" for none): other tools start a new segment.
    tools_key: str = ""

    def append(
        self,
        ids: list[int],
        *,
        generated: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        self.token_ids.extend(ids)
        self.response_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(
            logprobs if generated and logprobs is not None else [0.0] * len(ids)
        )
        if generated and versions is not None and len(versions) == len(ids):
            self.token_versions.extend(versions)
        elif generated:
            version = self.weight_versions[-1] if self.weight_versions else -1
            self.token_versions.extend([version] * len(ids))
        else:
            self.token_versions.extend([-1] * len(ids))

    @property
    def generated_tokens(self) -> int:
        return int(sum(self.response_mask))


@dataclass
class Reply:
    """One served call: the assistant message (OpenAI form), finish reason and token counts."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    call_index: int


class AgentSession:
    """The model endpoint of one episode (see the module docstring).

    A call *extends* the conversation when its messages are the previous call's
    messages, then the assistant message that call returned, then one or more
    non-assistant messages (user or ``tool`` results), with the same tools
    declared. Assistant messages are compared by meaning, not bytes
    (:mod:`~roll_async.agent_gateway.echo`: arguments as parsed JSON, content up
    to surrounding whitespace, calls by id), since frameworks re-serialise what
    they received and the echoed turn is never re-rendered; such echoes are
    counted (``echoes_by_meaning``). Its prompt is then the
    previous prompt ids + the generated ids as the engine returned them + the
    template's turn closure + the template delta for the new messages
    (``ChatPromptBuilder.closure_ids_after`` and ``continuation_ids``): nothing
    is re-rendered, a tool call's reply included. Any other call (the agent
    edited, dropped or summarised history, changed the reply or the tools)
    starts a new *segment* whose prompt is the template render of its messages;
    ``segment_breaks`` counts these.

    Function calling: the request's tools go to the chat template (its ``tools``
    argument), and the reply text is parsed by a vLLM tool parser
    (``tool_parser``, else detected from the template) into ``tool_calls``. A
    reply that looks like a call but does not parse is returned as content and
    counted (``tool_parse_errors``). ``tool_choice`` is not enforced by
    constrained decoding (the trainer could not reproduce its logprobs): with
    ``required`` or a named function, a reply without the asked call is
    returned as content, ``finish_reason: stop``, and counted
    (``tool_choice_unmet``); ``none`` declares the tools but parses nothing.

    Only the last segment becomes the trajectory (see docs/architecture.md "Agent
    sessions"); earlier segments are kept here for the counts. Requests the
    session cannot serve faithfully raise :class:`OpenAIError` (an OpenAI-style
    error response). When the episode's limits are reached (``max_steps``
    calls, or no room left under ``sequence_length``) the call gets an error too
    and the session records why, so the episode ends with that stop reason
    (unless a later call is served: the agent shortened its history).
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
        tool_parser: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_id = session_id
        self.prompts = prompts
        self._generate = generate
        self.model_name = model_name
        self.max_tokens_per_step = max_tokens_per_step
        self.sequence_length = sequence_length
        self.max_calls = max_calls
        #: A vLLM tool parser name; None detects it from the chat template when tools are declared.
        self.tool_parser = tool_parser
        self._clock = clock
        self.segments: list[Segment] = []
        self.segment_breaks = 0
        self.calls = 0
        #: Replies that looked like a tool call but did not parse (returned as content).
        self.tool_parse_errors = 0
        #: Replies without the call ``tool_choice`` (required / a named function) asked for.
        self.tool_choice_unmet = 0
        #: Parsed tool calls returned to the agent.
        self.tool_calls = 0
        #: Extending calls whose echoed assistant turns matched by meaning, not bytes (re-serialised by the agent).
        self.echoes_by_meaning = 0
        #: ``max_steps`` or ``max_length`` once a limit refused a call.
        self.limit_reason: str | None = None
        self.busy = False
        #: An engine failure (after retries) seen while serving; ends the rollout loop like any engine failure.
        self.engine_error: Exception | None = None
        self.last_activity = clock()
        self._lock = asyncio.Lock()
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._builders: dict[str, ChatPromptBuilder] = {"": prompts}
        self._parser: ToolCallParser | None = None
        self.closed = False

    # -- the endpoint ------------------------------------------------------------------

    async def chat_completion(self, body: Any) -> dict[str, Any]:
        """Serve one ``POST /v1/chat/completions`` body (non-streamed form); raises OpenAIError."""
        request = parse_chat_request(body, self.model_name)
        return self.completion_body(await self.serve(request))

    async def serve(self, request: ChatRequest) -> Reply:
        """Serve one checked call, in order with the session's other calls."""
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
                return await self._serve(request)
            finally:
                self.busy = False
                self.last_activity = self._clock()
                if task is not None:
                    self._in_flight.discard(task)

    def completion_body(self, reply: Reply) -> dict[str, Any]:
        """A reply as a ``chat.completion`` object."""
        return {
            "id": f"chatcmpl-{self.session_id}-{reply.call_index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": reply.message,
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage(reply),
        }

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

    async def _serve(self, request: ChatRequest) -> Reply:
        if self.calls >= self.max_calls:
            self.limit_reason = "max_steps"
            raise OpenAIError(
                400,
                f"this episode allows {self.max_calls} model calls (custom_envs.<tag>.max_steps)",
                code="max_steps_exceeded",
            )
        messages, sampling = request.messages, request.sampling
        tools_key = (
            json.dumps(request.tools.tools, sort_keys=True) if request.tools else ""
        )
        prompts = await self._prompts_for(request, tools_key)
        segment = self.segments[-1] if self.segments else None
        new_messages, by_meaning = self._extension(segment, messages, tools_key)
        now = self._clock()
        starts_segment = segment is None or new_messages is None
        try:
            if segment is not None and new_messages is not None:  # not starts_segment
                after = render_form([segment.reply_message])[0]
                prompt_delta = prompts.closure_ids_after(
                    segment.last_generated
                ) + prompts.continuation_ids(new_messages, after)
            else:
                prompt_delta = prompts.render_ids(
                    render_form(messages), add_generation_prompt=True
                )
        except ChatTemplateError as exc:
            raise OpenAIError(400, str(exc), param="messages") from None
        if segment is not None and new_messages is not None:  # not starts_segment
            previous = segment.turns[-1]
            previous.observation = "\n".join(m["content"] for m in new_messages)
            previous.env_step_s = now - self.last_activity
            prompt = segment.token_ids + prompt_delta
        else:
            segment = Segment(tools_key=tools_key)
            prompt = list(prompt_delta)
        budget = self.sequence_length - len(prompt)
        if budget <= 0:
            self.limit_reason = "max_length"
            raise context_length_exceeded(self.sequence_length, len(prompt))
        limit = min(self.max_tokens_per_step, budget)
        max_tokens = request.max_tokens
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
        self.echoes_by_meaning += by_meaning
        self.limit_reason = None  # a call served after a refusal: the agent recovered (trimmed its history)
        if starts_segment:
            self.segment_breaks += 1 if self.segments else 0
            self.segments.append(segment)
            segment.prompt_length = len(prompt_delta)
        segment.append(prompt_delta, generated=False)
        segment.weight_versions.extend(generation.weight_versions)
        segment.append(
            generation.token_ids,
            generated=True,
            logprobs=generation.logprobs,
            versions=list(getattr(generation, "token_versions", None) or []),
        )
        message, finish = self._reply_message(generation, request)
        segment.turns.append(
            generation.turn_record(
                len(segment.turns), self.prompts.decode(generation.token_ids)
            )
        )
        segment.messages, segment.last_generated = messages, list(generation.token_ids)
        segment.reply_message = {
            "role": "assistant",
            "content": message["content"] or "",
            **(
                {"tool_calls": message["tool_calls"]} if "tool_calls" in message else {}
            ),
        }
        self.calls += 1
        return Reply(
            message, finish, len(prompt), len(generation.token_ids), self.calls
        )

    async def _prompts_for(
        self, request: ChatRequest, tools_key: str
    ) -> ChatPromptBuilder:
        """The prompt builder that declares the request's tools (and its parser, loaded once off the event loop)."""
        if request.tools is None:
            return self.prompts
        if self._parser is None:
            name = self.tool_parser or detect_tool_parser(self.prompts.chat_template)
            if name is None:
                raise OpenAIError(
                    400,
                    "tools were given but this model's tool-call format is unknown: set model.tool_parser "
                    "to a vLLM tool parser (hermes, llama3_json, mistral, ...)",
                    param="tools",
                )
            self._parser = await asyncio.to_thread(
                ToolCallParser, name, self.prompts.tokenizer
            )
        if tools_key not in self._builders:
            try:
                self._builders[tools_key] = self.prompts.with_tools(request.tools.tools)
            except ChatTemplateError as exc:
                raise OpenAIError(400, str(exc), param="tools") from None
        return self._builders[tools_key]

    def _reply_message(
        self, generation: GenerationLike, request: ChatRequest
    ) -> tuple[Message, str]:
        """The assistant message and finish reason for a generation: content, or parsed tool calls."""
        stop = request.sampling.stop
        text = self._strip_stop(
            self.prompts.decode(generation.token_ids), generation.finish_reason, stop
        )
        finish = "length" if generation.finish_reason == "length" else "stop"
        tools = request.tools
        if tools is None or tools.choice == "none" or self._parser is None:
            return {"role": "assistant", "content": text}, finish
        raw = self._strip_stop(
            self.prompts.reply_text(generation.token_ids),
            generation.finish_reason,
            stop,
        )
        # ids unique in the episode, 9 characters as Mistral's templates require
        parsed = self._parser.parse(raw, tools, f"call{self.calls:04d}")
        if parsed.parse_error is not None:
            self.tool_parse_errors += 1
        unmet = (tools.choice == "required" and not parsed.tool_calls) or (
            tools.choice == "function"
            and not any(
                c["function"]["name"] == tools.function for c in parsed.tool_calls
            )
        )
        if unmet:
            self.tool_choice_unmet += 1
            parsed = ParsedReply(text, [])
        if not parsed.tool_calls:
            return {"role": "assistant", "content": text}, finish
        self.tool_calls += len(parsed.tool_calls)
        return {
            "role": "assistant",
            "content": parsed.content,
            "tool_calls": parsed.tool_calls,
        }, "tool_calls"

    @staticmethod
    def _extension(
        segment: Segment | None, messages: list[Message], tools_key: str
    ) -> tuple[list[Message] | None, bool]:
        """The new messages when ``messages`` extends the segment's last call, else None (a new segment); and
        whether the sent history matched by meaning only (see :func:`~roll_async.agent_gateway.echo.compare_history`)."""
        if segment is None or not segment.turns or segment.tools_key != tools_key:
            return None, False
        head = segment.messages + [segment.reply_message]
        new = messages[len(head) :]
        if not new or any(m["role"] == "assistant" for m in new):
            return None, False
        match = compare_history(messages[: len(head)], head)
        return (None, False) if match == "differs" else (new, match == "meaning")

    @staticmethod
    def _strip_stop(text: str, finish_reason: str, stop: list[str]) -> str:
        """A matched stop string removed from the end of a reply (the OpenAI API does not return it)."""
        if finish_reason == "stop":
            for s in stop:
                if s and text.endswith(s):
                    return text[: -len(s)]
        return text


def usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }
