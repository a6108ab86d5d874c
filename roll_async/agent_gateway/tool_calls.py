"""Function calling for agent sessions: the request's ``tools`` / ``tool_choice`` checked, and a reply's text parsed into OpenAI ``tool_calls`` by one of vLLM's own tool parsers (named by ``model.tool_parser`` or detected from the chat template), so an agent sees the calls the model's serving stack would give it while the trajectory keeps the generated ids as they are."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from roll_async.agent_gateway.errors import OpenAIError
from roll_async.errors import ParseError
from roll_async.prompts.tokenizers import ChatTokenizer

ChoiceMode = Literal["none", "auto", "required", "function"]

#: Chat-template markers -> the vLLM tool parser for that format (first match wins).
_TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<tool_call>",), "hermes"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|python_tag|>",), "llama3_json"),
    (("<|start_header_id|>", '"parameters"'), "llama3_json"),
)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True)
class ToolRequest:
    """A request's function tools (validated, as sent) and what ``tool_choice`` asks."""

    tools: list[dict[str, Any]]
    choice: ChoiceMode = "auto"
    #: The function a named ``tool_choice`` asks for.
    function: str | None = None

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


@dataclass
class ParsedReply:
    """A reply as the agent gets it: content, tool calls, and whether the parse failed."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: Why a reply that looked like a call was returned as content instead (None: no failure).
    parse_error: str | None = None


def parse_tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The request's ``tools`` and ``tool_choice``; None without tools. OpenAIError (400) names the parameter."""
    if body.get("functions") or body.get("function_call"):
        raise OpenAIError(
            400,
            "the deprecated functions / function_call parameters are not supported; use tools and tool_choice",
            param="functions",
        )
    raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if not raw:
        if choice_raw not in (None, "none", "auto"):
            raise OpenAIError(
                400, "tool_choice needs tools to choose from", param="tool_choice"
            )
        return None
    if not isinstance(raw, list):
        raise OpenAIError(400, "tools must be a list", param="tools")
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        tools.append(_checked_tool(tool, f"tools[{i}]"))
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise OpenAIError(400, f"tools declare a name twice: {names}", param="tools")
    if choice_raw is None or choice_raw in ("auto", "none", "required"):
        return ToolRequest(tools, choice_raw or "auto")
    function = (
        (choice_raw.get("function") or {}).get("name")
        if isinstance(choice_raw, dict) and choice_raw.get("type") == "function"
        else None
    )
    if function is None and isinstance(choice_raw, dict):
        function = choice_raw.get("name")  # the Responses API's flat form
    if not isinstance(function, str) or function not in names:
        raise OpenAIError(
            400,
            f"tool_choice={choice_raw!r} must be 'none', 'auto', 'required' or "
            f"{{'type': 'function', 'function': {{'name': one of {names}}}}}",
            param="tool_choice",
        )
    return ToolRequest(tools, "function", function)


def _checked_tool(tool: Any, where: str) -> dict[str, Any]:
    """One ``{"type": "function", "function": {name, description?, parameters?}}`` tool, its schema checked."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise OpenAIError(
            400,
            f"{where} must be {{'type': 'function', 'function': {{...}}}}; only function tools are served",
            param="tools",
        )
    function = tool.get("function")
    if not isinstance(function, dict):
        raise OpenAIError(400, f"{where}.function must be an object", param="tools")
    name = function.get("name")
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        raise OpenAIError(
            400,
            f"{where}.function.name={name!r} must be a non-empty name of letters, digits, _ and -",
            param="tools",
        )
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise OpenAIError(
            400,
            f"{where}.function.parameters must be a JSON Schema object",
            param="tools",
        )
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as exc:
        raise OpenAIError(
            400,
            f"{where}.function.parameters is not a valid JSON Schema: {exc.message}",
            param="tools",
        ) from None
    return tool  # as sent: the template renders the agent's own tool definitions


def detect_tool_parser(chat_template: str | None) -> str | None:
    """The vLLM tool parser for a chat template's call format (hermes, mistral, llama3_json), or None."""
    template = chat_template or ""
    for markers, name in _TEMPLATE_MARKERS:
        if all(m in template for m in markers):
            return name
    return None


_PARSER_CLASSES: dict[str, Any] = {}
_PARSER_LOCK = threading.Lock()


def load_parser_class(name: str) -> Any:
    """vLLM's registered tool parser class ``name`` (imports vLLM once: seconds; call it off the event loop)."""
    with _PARSER_LOCK:
        if name not in _PARSER_CLASSES:
            # vLLM is heavy and needed only by sessions that declare tools.
            from vllm.tool_parsers import ToolParserManager

            try:
                _PARSER_CLASSES[name] = ToolParserManager.get_tool_parser(name)
            except KeyError:
                raise OpenAIError(
                    400,
                    f"model.tool_parser={name!r} is not one of vLLM's tool parsers "
                    f"({', '.join(sorted(ToolParserManager.list_registered()))})",
                    param="tools",
                ) from None
        return _PARSER_CLASSES[name]


class ToolCallParser:
    """Parses reply text into tool calls with a vLLM tool parser (one fresh parser per reply: they keep state)."""

    def __init__(self, name: str, tokenizer: ChatTokenizer) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self._cls = load_parser_class(name)
        try:
            probe = self._cls(tokenizer)
        except Exception as exc:  # e.g. the tokenizer lacks the parser's call token
            raise OpenAIError(
                400,
                f"the tool parser {name!r} does not fit this model's tokenizer ({exc}); "
                "set model.tool_parser to the parser of the model's tool-call format",
                param="tools",
            ) from None
        #: Texts that mark an attempted call (a reply holding one that does not parse is a parse error).
        self.markers = [
            m
            for m in (
                getattr(probe, "tool_call_start_token", None),
                getattr(probe, "bot_token", None),
            )
            if isinstance(m, str) and m
        ]

    def parse(self, text: str, request: ToolRequest, call_prefix: str) -> ParsedReply:
        """Content and calls of ``text``; a failed or invalid call gives the whole text as content with parse_error set."""
        # vLLM's request type is needed by its parsers' signature; loaded with them.
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
        )

        vllm_request = ChatCompletionRequest(
            model="roll-async",
            messages=[{"role": "user", "content": ""}],
            tools=request.tools,
            tool_choice="auto",
        )
        looks_like_call = any(m in text for m in self.markers) or (
            self.name.startswith("llama") and text.lstrip().startswith("{")
        )
        try:
            extracted = self._cls(self.tokenizer, request.tools).extract_tool_calls(
                text, vllm_request
            )
        except (
            Exception
        ) as exc:  # a parser bug or odd text must never crash the session
            return ParsedReply(text, [], f"{type(exc).__name__}: {exc}")
        if not extracted.tools_called or not extracted.tool_calls:
            return ParsedReply(
                text,
                [],
                "the reply is not a valid tool call" if looks_like_call else None,
            )
        calls = []
        for i, call in enumerate(extracted.tool_calls):
            name, arguments = call.function.name, call.function.arguments or "{}"
            if name not in request.names:
                return ParsedReply(
                    text, [], f"the reply calls an undeclared function {name!r}"
                )
            try:
                if not isinstance(json.loads(arguments), dict):
                    raise ParseError("arguments are not a JSON object")
            except ValueError as exc:
                return ParsedReply(
                    text, [], f"the arguments of {name!r} do not parse: {exc}"
                )
            calls.append(
                {
                    "id": f"{call_prefix}{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        return ParsedReply(extracted.content or None, calls)
