"""Function tools in env episodes: an env that declares tools (``info["tools"]`` from reset) gets them rendered through the model's chat template and its replies parsed into calls by the model's tool parser, with the tool results appended as the template's ``tool`` turns, token-exact, the same way agent sessions do it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from roll_async.agent_gateway.chat_request import render_form
from roll_async.agent_gateway.errors import OpenAIError
from roll_async.agent_gateway.tool_calls import (
    ToolCallParser,
    ToolRequest,
    detect_tool_parser,
    parse_tool_request,
)
from roll_async.envs.tool_actions import encode_tool_calls
from roll_async.errors import ChatTemplateError, RollAsyncError
from roll_async.prompts.prompt_builder import ChatPromptBuilder


class EnvToolsError(RollAsyncError, ValueError):
    """An env declared tools this model cannot serve (template, parser or schema); ends the episode as env_error."""


@dataclass
class ToolTurn:
    """One reply of a tool-using episode: the action for ``step`` and the calls it carried."""

    action_text: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    parse_error: bool = False


class EnvTools:
    """The prompts and parser of one episode's declared tools (see the module docstring)."""

    def __init__(
        self, prompts: ChatPromptBuilder, request: ToolRequest, parser: ToolCallParser
    ) -> None:
        self.prompts = prompts
        self.request = request
        self.parser = parser
        self.parse_errors = 0
        self.calls = 0

    @classmethod
    async def open(
        cls, base: ChatPromptBuilder, tools: Any, parser_name: str | None
    ) -> EnvTools:
        """Check the env's tools, build the prompt builder that declares them and load the parser (off the loop)."""
        try:
            request = parse_tool_request({"tools": tools})
            name = parser_name or detect_tool_parser(base.chat_template)
            if request is None or name is None:
                raise EnvToolsError(
                    "the env declares tools but the model's tool-call format is unknown: set model.tool_parser"
                    if request is not None
                    else "the env's info['tools'] is empty"
                )
            parser = await asyncio.to_thread(ToolCallParser, name, base.tokenizer)
            return cls(base.with_tools(request.tools), request, parser)
        except (OpenAIError, ChatTemplateError) as exc:
            raise EnvToolsError(f"the env's tools cannot be served: {exc}") from None

    def turn(self, generated_ids: list[int], turn: int) -> ToolTurn:
        """The action for ``step``: the encoded calls, or the reply's text when it made none."""
        raw = self.prompts.reply_text(generated_ids)
        parsed = self.parser.parse(raw, self.request, f"call{turn:04d}")
        if parsed.parse_error is not None:
            self.parse_errors += 1
        if not parsed.tool_calls:
            return ToolTurn(
                self.prompts.decode(generated_ids), [], parsed.parse_error is not None
            )
        self.calls += len(parsed.tool_calls)
        return ToolTurn(encode_tool_calls(parsed.tool_calls), parsed.tool_calls)

    def delta_ids(
        self,
        generated_ids: list[int],
        tool_turn: ToolTurn,
        observation: str,
        user_text: str,
    ) -> list[int]:
        """Closure + the template's delta: the observation as the first call's ``tool`` result (later calls of
        the turn are answered as not run), or as a user turn when the reply made no call."""
        closure = self.prompts.closure_ids_after(generated_ids)
        if not tool_turn.calls:
            return closure + self.prompts.user_delta_ids(user_text)
        results = [
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": observation if i == 0 else "not run: one call per turn",
            }
            for i, call in enumerate(tool_turn.calls)
        ]
        after = render_form(
            [{"role": "assistant", "content": "", "tool_calls": tool_turn.calls}]
        )[0]
        return closure + self.prompts.continuation_ids(results, after)
