"""Incremental, token-exact prompt building from any chat template.

Re-rendering a conversation through its chat template does not reproduce the
ids the engine generated (templates strip think blocks, merge system prompts,
re-tokenize text), so a conversation's ids are built once and only appended to,
with the pieces between turns cut exactly out of the template's own renders.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_async.config.sections import ModelConfig
from roll_async.errors import ChatTemplateError, InvalidInputError
from roll_async.prompts.tokenizers import ChatTokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: Stand in for messages when measuring what the template puts around them.
_SENTINEL_REPLY = "ROLL_ASYNC_SENTINEL_REPLY"
#: Texts whose ids a builder keeps, per cache (first prompts, user turns): ~4 KB per text of ~100 tokens.
_TEXT_CACHE_SIZE = 4096
_SENTINEL_USER = "ROLL_ASYNC_SENTINEL_USER"
_SENTINEL_NEXT = "ROLL_ASYNC_SENTINEL_NEXT"
_SENTINEL_NEXT_REPLY = "ROLL_ASYNC_SENTINEL_NEXT_REPLY"
_SENTINEL_LAST_USER = "ROLL_ASYNC_SENTINEL_LAST_USER"
_SENTINEL_LAST_REPLY = "ROLL_ASYNC_SENTINEL_LAST_REPLY"
#: Tool lists whose builders a builder keeps (with_tools); more distinct lists start the cache over.
_TOOL_BUILDERS_KEPT = 32

_FIX = "set model.chat_template to a template file that keeps every message's content"


def _common_prefix(a: str, b: str) -> str:
    """Longest common prefix, in characters."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


@dataclass
class TemplateBehaviour:
    """What the template does, as measured on a mock three-turn conversation (preflight, check-model)."""

    #: A fresh render of the whole conversation equals the incremental ids (no rewrite of earlier turns).
    append_only: bool
    #: Text appended after an assistant reply (its first token is usually the model's EOS).
    closure: str
    #: Text of one more user turn, generation prompt included (with a placeholder user text).
    user_turn: str
    #: What the first render holds before the first message (BOS etc.).
    leading_text: str
    #: Human-readable findings, e.g. "rewrites earlier assistant turns (think stripping)".
    notes: list[str] = field(default_factory=list)


class ChatPromptBuilder:
    """Builds first-turn ids, turn closures and continuations (next user/tool turns) for one tokenizer.

    ``system_prompt`` is included in every rendering (first turn and the reference
    conversations), so templates that inject a default system message agree with
    themselves. ``chat_template`` overrides the tokenizer's template (the text of
    ``model.chat_template``); ``template_kwargs`` go to every render (e.g.
    ``{"enable_thinking": False}``). Thread-safe for reads; holds no per-conversation state.

    Token-in/token-out: a conversation's ids are built once and only ever appended
    to. The first turn goes through the chat template (system, then the user
    message with instruction and observation, then the generation prompt). After
    each model turn the engine's output ids are appended exactly as returned, then
    two pieces that come from the template, never from re-tokenizing history:

    * the turn closure: what the template puts after an assistant message's
      content when another message follows (ChatML: ``<|im_end|>\\n``). If the
      model already ended on the closure's first token (its EOS) only the rest is
      appended; if it stopped on a stop string or ran out of tokens the whole
      closure is appended. These tokens were not generated: response_mask 0.
    * the continuation: the next non-assistant message(s) and the generation
      prompt, i.e. what the template renders for one more user (or tool) turn.

    Both are found by *locating sentinel messages inside one longer render*, not
    by requiring the longer render to start with the shorter one, so templates
    that rewrite other parts of the conversation still give exact pieces:

    * think stripping (Qwen3): earlier assistant turns lose their ``<think>``
      block in a fresh render. The model's own generated ids stay in the context
      (token-in/token-out); only the closure and the next user turn come from the
      template. ``rollout/prefix_mismatch_rate`` reports how often a fresh render
      differs.
    * a system prompt merged into the last user message (Mistral) or into the
      first one (Gemma, no system role): the first turn is rendered as the template
      renders it; later user turns are rendered as the template renders a user
      message *followed by a reply*, so the system prompt is not repeated per turn.
      A template that merges it into the last user message wherever that message
      stands (followed by a reply or not) is measured with one more user turn and
      reply after the piece (``_measure_trailer``), so no later turn carries it either.
    * BOS (Llama-3, Gemma, Mistral) belongs to the first render only; a
      generation prompt that varies (``enable_thinking``) is taken from the
      template's own ``add_generation_prompt`` output for the message's role.

    How a continuation is cut out of a render of ``H + messages + [reply2]``
    (``H`` = system, sentinel user, sentinel reply): the text between the end of
    the sentinel reply and the start of ``reply2`` is ``closure + messages + tail``,
    where ``tail`` (end of the last message plus the next assistant header) is
    measured once per role on a sentinel message; the generation-prompt ending is
    measured the same way from ``H + [sentinel message]`` with
    ``add_generation_prompt=True``. A template that drops assistant content or
    cannot render the pieces consistently raises ``ChatTemplateError`` naming the
    behaviour; ``model.chat_template`` (a file) overrides the tokenizer's template.
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        system_prompt: str | None = None,
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; use a chat model's tokenizer "
                "or set model.chat_template to a Jinja chat template file"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt or None
        self.template_kwargs = dict(template_kwargs or {})
        self._role_endings: dict[str, tuple[str, str]] = {}
        #: A fast tokenizer's Rust backend: encoding through it skips the Python wrapper (~half the cost per turn).
        self._backend: Tokenizer | None = getattr(tokenizer, "backend_tokenizer", None)
        # A group's envs share a seed, so their first prompts are identical, and envs repeat observations
        # ("invalid action"): rendering and encoding the same text again is the largest per-turn cost.
        self._first_turn_cache = functools.lru_cache(maxsize=_TEXT_CACHE_SIZE)(
            self._first_turn_tuple
        )
        self._user_delta_cache = functools.lru_cache(maxsize=_TEXT_CACHE_SIZE)(
            self._user_delta_tuple
        )
        #: Builders that declare a tool list (with_tools), by the list's JSON.
        self._tool_builders: dict[str, ChatPromptBuilder] = {}
        self._closure_text = self._measure_closure_text()
        self._trailing = self._measure_trailer()
        self.closure_ids: list[int] = self.encode(self._closure_text)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids: set[int] = {eos} if isinstance(eos, int) else set()

    @classmethod
    def for_model(
        cls,
        tokenizer: ChatTokenizer,
        model: ModelConfig,
        system_prompt: str | None = None,
    ) -> ChatPromptBuilder:
        """A builder honouring ``model.chat_template`` (a file) and ``model.chat_template_kwargs`` of a ModelConfig."""
        template_file = getattr(model, "chat_template", None)
        chat_template = None
        if template_file:
            path = Path(template_file).expanduser()
            if not path.is_file():
                raise ChatTemplateError(
                    f"model.chat_template={template_file!r} does not exist; point it at a Jinja chat template file"
                )
            chat_template = path.read_text()
        return cls(
            tokenizer,
            system_prompt,
            chat_template=chat_template,
            template_kwargs=dict(getattr(model, "chat_template_kwargs", None) or {}),
        )

    def with_tools(self, tools: list[dict[str, Any]]) -> ChatPromptBuilder:
        """A builder whose every render passes ``tools`` (OpenAI function tools) to the template.

        The pieces are measured again with the tools declared, so a template that
        places tool definitions next to a message (Mistral: before the last user
        message) gives the deltas it renders with them. Raises ChatTemplateError
        when the template ignores ``tools`` (a function's name does not appear in
        a render that declares it). Built once per distinct tool list (an agent
        tag's episodes usually declare the same tools).
        """
        key = json.dumps(tools, sort_keys=True)
        cached = self._tool_builders.get(key)
        if cached is not None:
            return cached
        builder = ChatPromptBuilder(
            self.tokenizer,
            self.system_prompt,
            chat_template=self.chat_template,
            template_kwargs={**self.template_kwargs, "tools": list(tools)},
        )
        rendered = builder._render(
            builder._system() + [{"role": "user", "content": _SENTINEL_USER}],
            add_generation_prompt=True,
        )
        for tool in tools:
            name = str((tool.get("function") or {}).get("name", ""))
            if name and name not in rendered:
                raise ChatTemplateError(
                    f"the chat template does not render tools (the function {name!r} does not appear in a "
                    "render that declares it); set model.chat_template to a template that renders its "
                    "`tools` argument"
                )
        if len(self._tool_builders) >= _TOOL_BUILDERS_KEPT:
            self._tool_builders.clear()
        self._tool_builders[key] = builder
        return builder

    # -- rendering -------------------------------------------------------------------

    def _system(self) -> list[dict[str, str]]:
        return (
            [{"role": "system", "content": self.system_prompt}]
            if self.system_prompt
            else []
        )

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool
    ) -> str:
        try:
            rendered: str = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=self.chat_template,
                **self.template_kwargs,
            )
            return rendered
        except Exception as exc:  # jinja2 TemplateError, raise_exception(...) in the template, TypeError, ...
            roles = "/".join(str(m.get("role")) for m in messages)
            raise ChatTemplateError(
                f"the chat template cannot render the roles {roles} ({type(exc).__name__}: {exc}); "
                f"{_FIX} and renders this role order"
            ) from None

    def render_ids(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool
    ) -> list[int]:
        """A fresh full render of ``messages`` through the template, tokenized (BOS comes from the template)."""
        return self.encode(self._render(list(messages), add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Plain tokenization of template text (no BOS/EOS added: the template holds them)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: list[int]) -> str:
        """Text handed to the env: special tokens (EOS) removed."""
        return self._decode(token_ids, skip_special_tokens=True)

    def _decode(
        self, token_ids: Sequence[int], *, skip_special_tokens: bool = False
    ) -> str:
        """transformers' decode. Without clean-up it is the fast backend's decode plus a per-id type check
        that costs more than the decode itself on long conversations, so the backend is called directly."""
        if self._backend is not None and not getattr(
            self.tokenizer, "clean_up_tokenization_spaces", True
        ):
            return self._backend.decode(
                list(token_ids), skip_special_tokens=skip_special_tokens
            )
        text: str = self.tokenizer.decode(
            list(token_ids), skip_special_tokens=skip_special_tokens
        )
        return text

    def _reference(self) -> list[dict[str, str]]:
        """System, a sentinel user message and a sentinel reply: the closed turn continuations follow."""
        return self._system() + [
            {"role": "user", "content": _SENTINEL_USER},
            {"role": "assistant", "content": _SENTINEL_REPLY},
        ]

    @staticmethod
    def _end_of(text: str, sentinel: str, what: str) -> int:
        position = text.find(sentinel)
        if position < 0:
            raise ChatTemplateError(
                f"the chat template drops {what} content (a sentinel {what} message does not appear in the render); "
                f"it cannot be used for multi-turn rollouts; {_FIX}"
            )
        return position + len(sentinel)

    def _measure_closure_text(self) -> str:
        """What follows a reply: common to the reply as the last message and the reply followed by a user turn."""
        reference = self._reference()
        final = self._render(reference, add_generation_prompt=False)
        closure_when_last = final[self._end_of(final, _SENTINEL_REPLY, "assistant") :]
        followed = self._render(
            reference
            + [
                {"role": "user", "content": _SENTINEL_NEXT},
                {"role": "assistant", "content": _SENTINEL_NEXT_REPLY},
            ],
            add_generation_prompt=False,
        )
        after_reply = followed[self._end_of(followed, _SENTINEL_REPLY, "assistant") :]
        if _SENTINEL_NEXT not in after_reply:
            raise ChatTemplateError(
                f"the chat template drops user messages that follow an assistant reply; {_FIX}"
            )
        # Common to both, cut at a token boundary (``<|end|>\\n<|`` of ``<|endoftext|>`` / ``<|user|>`` is not a closure).
        common = _common_prefix(closure_when_last, after_reply)
        ids = self.encode(common)
        while ids and not (
            after_reply.startswith(self._decode(ids))
            and self.encode(after_reply)[: len(ids)] == ids
        ):
            ids = ids[:-1]
        return self._decode(ids) if ids else ""

    def _measure_trailer(self) -> list[dict[str, str]]:
        """Messages rendered after a measured piece's reply: none, or one more user turn and reply when the
        template puts the system prompt on the last user message even when a reply follows it (the piece
        would otherwise carry the system prompt into every later turn)."""
        if not self.system_prompt:
            return []
        rendered = self._render(
            self._reference()
            + [
                {"role": "user", "content": _SENTINEL_NEXT},
                {"role": "assistant", "content": _SENTINEL_NEXT_REPLY},
            ],
            add_generation_prompt=False,
        )
        region = rendered[
            self._end_of(rendered, _SENTINEL_REPLY, "assistant") : rendered.rfind(
                _SENTINEL_NEXT_REPLY
            )
        ]
        if self.system_prompt not in region:
            return []
        return [
            {"role": "user", "content": _SENTINEL_LAST_USER},
            {"role": "assistant", "content": _SENTINEL_LAST_REPLY},
        ]

    def _role_ending(self, role: str) -> tuple[str, str]:
        """(tail, prompt_ending) for a last message of ``role``: its end + the next assistant header, and
        its end + the generation prompt, both measured on a sentinel message."""
        if role not in self._role_endings:
            probe = {"role": role, "content": _SENTINEL_NEXT}
            followed = self._render(
                self._reference()
                + [probe, {"role": "assistant", "content": _SENTINEL_NEXT_REPLY}]
                + self._trailing,
                add_generation_prompt=False,
            )
            tail_start = self._end_of(followed, _SENTINEL_NEXT, role)
            tail_end = followed.rfind(_SENTINEL_NEXT_REPLY)
            if tail_end < tail_start:
                raise ChatTemplateError(
                    f"the chat template drops assistant content after a {role} message; {_FIX}"
                )
            prompted = self._render(
                self._reference() + [probe], add_generation_prompt=True
            )
            prompt_ending = prompted[self._end_of(prompted, _SENTINEL_NEXT, role) :]
            self._role_endings[role] = (followed[tail_start:tail_end], prompt_ending)
        return self._role_endings[role]

    # -- the pieces ------------------------------------------------------------------

    def first_turn_ids(self, user_text: str) -> list[int]:
        """System prompt + first user message + generation prompt, through the template (cached by text)."""
        return list(self._first_turn_cache(user_text))

    def _first_turn_tuple(self, user_text: str) -> tuple[int, ...]:
        messages = self._system() + [{"role": "user", "content": user_text}]
        return tuple(self.render_ids(messages, add_generation_prompt=True))

    def closure_ids_after(self, generated_ids: list[int]) -> list[int]:
        """Ids that close the assistant turn after ``generated_ids`` (see the class docstring)."""
        if (
            generated_ids
            and self.closure_ids
            and generated_ids[-1] == self.closure_ids[0]
        ):
            return list(self.closure_ids[1:])
        return list(self.closure_ids)

    def continuation_text(
        self,
        messages: list[dict[str, Any]],
        after: dict[str, Any] | None = None,
    ) -> str:
        """Template text of ``messages`` (user/tool/system) after a closed assistant turn, generation prompt included.

        ``after`` is the assistant message the continuation follows when it made tool calls
        (arguments as objects): tool results are then cut out of renders that follow that very
        call, since templates check that tool results answer a call (Mistral's alternation).
        """
        if not messages:
            raise InvalidInputError("continuation needs at least one message")
        roles = [m.get("role") for m in messages]
        if "assistant" in roles:
            raise InvalidInputError(
                f"a continuation holds non-assistant messages only (got roles {roles})"
            )
        if after is not None and after.get("tool_calls"):
            return self._after_tool_calls_text(messages, after)
        tail, prompt_ending = self._role_ending(str(roles[-1]))
        rendered = self._render(
            self._reference()
            + list(messages)
            + [{"role": "assistant", "content": _SENTINEL_NEXT_REPLY}]
            + self._trailing,
            add_generation_prompt=False,
        )
        region = rendered[
            self._end_of(rendered, _SENTINEL_REPLY, "assistant") : rendered.rfind(
                _SENTINEL_NEXT_REPLY
            )
        ]
        if (
            not region.startswith(self._closure_text)
            or not region.endswith(tail)
            or len(region) < len(self._closure_text) + len(tail)
        ):
            raise ChatTemplateError(
                f"the chat template renders a closed assistant turn followed by roles {roles} differently from the "
                f"same turn followed by a single sentinel message, so the next turn's text cannot be cut out; {_FIX}"
            )
        return region[len(self._closure_text) : len(region) - len(tail)] + prompt_ending

    def continuation_ids(
        self,
        messages: list[dict[str, Any]],
        after: dict[str, Any] | None = None,
    ) -> list[int]:
        """Ids the template renders for ``messages`` (user/tool/system) appended after a closed assistant turn,
        ending with the generation prompt (``after``: see :meth:`continuation_text`)."""
        return self.encode(self.continuation_text(messages, after))

    def _after_tool_calls_text(
        self, messages: list[dict[str, Any]], after: dict[str, Any]
    ) -> str:
        """The continuation after a tool-call turn: a render with ``messages`` and the generation prompt,
        less the render that ends with the tool-call turn (cut just after that turn's closure)."""
        reference = self._system() + [
            {"role": "user", "content": _SENTINEL_USER},
            {**after, "role": "assistant", "content": _SENTINEL_REPLY},
        ]
        closed = self._render(reference, add_generation_prompt=False)
        continued = self._render(reference + list(messages), add_generation_prompt=True)
        common = _common_prefix(closed, continued)
        closure_end = common.rfind(self._closure_text) if self._closure_text else -1
        cut = closure_end + len(self._closure_text) if closure_end >= 0 else len(common)
        text = continued[cut:]
        if cut < len(self._reference_head_text()) or any(
            str(m.get("content") or "") not in text for m in messages
        ):
            raise ChatTemplateError(
                "the chat template renders a tool-call turn followed by its results so that the results cannot "
                f"be cut out of the render; {_FIX}"
            )
        return text

    def _reference_head_text(self) -> str:
        """The render up to the sentinel user message (what every reference render starts with)."""
        rendered = self._render(
            self._system() + [{"role": "user", "content": _SENTINEL_USER}],
            add_generation_prompt=False,
        )
        return rendered[: rendered.find(_SENTINEL_USER)]

    def user_delta_ids(self, user_text: str) -> list[int]:
        """The next user message and the generation prompt, as the template renders them after a closed reply
        (cached by text)."""
        return list(self._user_delta_cache(user_text))

    def _user_delta_tuple(self, user_text: str) -> tuple[int, ...]:
        return tuple(self.continuation_ids([{"role": "user", "content": user_text}]))

    # -- what the template does ------------------------------------------------------

    def reply_prefix(self) -> str:
        """What the template puts before a reply's content beyond the generation prompt (Mistral ``" "``,
        Qwen3 ``<think>\\n\\n</think>\\n\\n`` on the last reply): a model trained on the template generates it."""
        tail, prompt_ending = self._role_ending("user")
        return tail[len(prompt_ending) :] if tail.startswith(prompt_ending) else ""

    def reply_text(self, generated_ids: list[int]) -> str:
        """The assistant message content a fresh render would get for ``generated_ids``: all the generated
        text, special tokens included, without a trailing end-of-turn token the closure supplies (another
        EOS, e.g. Phi-3's ``<|endoftext|>``, stays: the closure follows it in the ids too)."""
        ids = list(generated_ids)
        # the closure supplies it (closure_ids_after)
        if ids and self.closure_ids and ids[-1] == self.closure_ids[0]:
            ids = ids[:-1]
        return self._decode(ids)

    def incremental_ids(
        self, user_texts: list[str], generated: list[list[int]]
    ) -> list[int]:
        """The token-in/token-out ids of a conversation: first turn, then per reply its ids, closure, next user turn."""
        ids = self.first_turn_ids(user_texts[0])
        for index, reply_ids in enumerate(generated):
            ids += list(reply_ids)
            if index + 1 < len(user_texts):
                ids += self.closure_ids_after(reply_ids) + self.user_delta_ids(
                    user_texts[index + 1]
                )
        return ids

    def fresh_render_text(
        self, user_texts: list[str], generated: list[list[int]]
    ) -> str:
        """A fresh render of the same conversation from its text (what re-templating the history gives)."""
        messages = self._system()
        for index, user_text in enumerate(user_texts):
            messages = messages + [{"role": "user", "content": user_text}]
            if index < len(generated):
                messages = messages + [
                    {"role": "assistant", "content": self.reply_text(generated[index])}
                ]
        return self._render(
            messages, add_generation_prompt=len(user_texts) > len(generated)
        )

    def fresh_render_differs(
        self, token_ids: list[int], user_texts: list[str], generated: list[list[int]]
    ) -> bool:
        """True when the text of ``token_ids`` is not a prefix of a fresh render of the conversation.

        Compared as text, so a random model's non-canonical tokenizations do not count; what counts is
        what the template does (think stripping, a system prompt moved, content trimmed).
        """
        text = self._decode(token_ids)
        return not self.fresh_render_text(user_texts, generated).startswith(text)

    def describe(self) -> TemplateBehaviour:
        """Render a mock three-turn conversation both ways and say what the template does.

        Raises ChatTemplateError when a piece cannot be derived (preflight uses this).
        """
        user_texts = ["first user turn", "second user turn", "third user turn"]
        prefix = self.reply_prefix()
        generated = [
            self.encode(prefix + reply) + self.closure_ids[:1]
            for reply in ("reply one", "reply two")
        ]
        for text in user_texts[1:]:
            if text not in self.continuation_text([{"role": "user", "content": text}]):
                raise ChatTemplateError(
                    f"the chat template drops the content of user messages after the first; {_FIX}"
                )
        ids = self.incremental_ids(user_texts, generated)
        append_only = not self.fresh_render_differs(ids, user_texts, generated) and len(
            self.fresh_render_text(user_texts, generated)
        ) == len(self._decode(ids))
        notes: list[str] = []
        first = self._render(
            self._system() + [{"role": "user", "content": _SENTINEL_USER}],
            add_generation_prompt=True,
        )
        leading = first[: first.find(_SENTINEL_USER)]
        if self.system_prompt:
            without = self._render(
                [{"role": "user", "content": _SENTINEL_USER}],
                add_generation_prompt=True,
            )
            if leading.startswith(without[: without.find(_SENTINEL_USER)]):
                notes.append("system prompt merged into the first user message")
            fresh = self.fresh_render_text(user_texts, generated)
            if fresh.count(self.system_prompt) and fresh.find(
                self.system_prompt
            ) > fresh.find(user_texts[0]):
                notes.append(
                    "a fresh render moves the system prompt to the last user message; it is kept once, in the first turn"
                )
        if "<think>" in prefix or "<think>" in self._decode(ids):
            notes.append(
                "rewrites earlier assistant turns (think stripping); the model's own ids are kept"
            )
        if prefix.strip() == "" and prefix:
            notes.append(f"reply starts with {prefix!r} after the generation prompt")
        if not append_only and not notes:
            notes.append(
                "a fresh render differs from the incremental ids (the template rewrites earlier turns)"
            )
        return TemplateBehaviour(
            append_only,
            self._closure_text,
            self.continuation_text([{"role": "user", "content": "USER"}]),
            leading,
            notes,
        )
