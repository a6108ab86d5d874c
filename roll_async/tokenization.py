"""Incremental, token-exact prompt building from a chat template.

Token-in/token-out: a conversation's ids are built once and only ever appended
to. The first turn goes through the chat template (system, then the user
message with instruction and observation, then the generation prompt). After
each model turn the engine's output ids are appended exactly as returned, then
two pieces that come from the template, never from re-tokenizing history:

* the turn closure: what the template puts after an assistant message's
  content (ChatML: ``<|im_end|>\\n``). If the model already ended on the
  closure's first token (its EOS, e.g. ``<|im_end|>``) only the rest is
  appended (``\\n``); if it stopped on a stop string or ran out of tokens the
  whole closure is appended. These tokens were not generated: response_mask 0.
* the user delta: the next user message and the generation prompt, i.e. what
  the template adds when one more user message follows the closed assistant
  message.

Both are found by rendering a short reference conversation with a sentinel
assistant reply and taking the text differences, which works for any template
that renders a conversation as the concatenation of its messages (ChatML,
Llama-3, Qwen, Mistral-style). A template that rewrites earlier messages when
a new one is added is rejected with a clear error rather than silently
producing ids the model never saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Stands in for an assistant reply when measuring what the template puts around it.
_SENTINEL_REPLY = "ROLL_ASYNC_SENTINEL_REPLY"
_SENTINEL_USER = "ROLL_ASYNC_SENTINEL_USER"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used incrementally."""


class ChatPromptBuilder:
    """Builds first-turn ids, per-turn user deltas and turn closures for one tokenizer.

    ``system_prompt`` is included in every rendering (first turn and the reference
    conversations), so templates that inject a default system message agree with
    themselves. Thread-safe for reads; holds no per-conversation state.
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; use a chat model's tokenizer "
                "or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt or None
        #: A fast tokenizer's Rust backend: encoding through it skips the Python wrapper (~half the cost per turn).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._closure_text = self._measure_closure_text()
        #: The reference conversation user deltas are measured against; constant, so rendered once.
        self._delta_history = self._system() + [
            {"role": "user", "content": _SENTINEL_USER},
            {"role": "assistant", "content": _SENTINEL_REPLY},
        ]
        self._delta_before = self._render(self._delta_history, add_generation_prompt=False)
        self.closure_ids: list[int] = self.encode(self._closure_text)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids: set[int] = {eos} if isinstance(eos, int) else set()

    # -- rendering -------------------------------------------------------------------

    def _system(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Plain tokenization of template text (no BOS/EOS added: the template holds them)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: list[int]) -> str:
        """Text handed to the env: special tokens (EOS) removed."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _measure_closure_text(self) -> str:
        history = self._system() + [{"role": "user", "content": _SENTINEL_USER}]
        with_reply = self._render(history + [{"role": "assistant", "content": _SENTINEL_REPLY}], False)
        position = with_reply.rfind(_SENTINEL_REPLY)
        if position < 0:
            raise ChatTemplateError("the chat template drops assistant message content; it cannot be used for multi-turn rollouts")
        return with_reply[position + len(_SENTINEL_REPLY):]

    # -- the three pieces ------------------------------------------------------------

    def first_turn_ids(self, user_text: str) -> list[int]:
        """System prompt + first user message + generation prompt, through the template."""
        messages = self._system() + [{"role": "user", "content": user_text}]
        return self.encode(self._render(messages, add_generation_prompt=True))

    def closure_ids_after(self, generated_ids: list[int]) -> list[int]:
        """Ids that close the assistant turn after ``generated_ids`` (see module docstring)."""
        if generated_ids and self.closure_ids and generated_ids[-1] == self.closure_ids[0]:
            return list(self.closure_ids[1:])
        return list(self.closure_ids)

    def user_delta_ids(self, user_text: str) -> list[int]:
        """The next user message and the generation prompt, as the template renders them after a closed reply."""
        before = self._delta_before
        after = self._render(self._delta_history + [{"role": "user", "content": user_text}], add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template re-renders earlier messages when a user message is appended "
                "(the longer conversation does not start with the shorter one), so incremental token ids "
                "would differ from what the model sees; use a prefix-stable template"
            )
        return self.encode(after[len(before):])


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """Load a Hugging Face tokenizer for rollouts.

    A local directory with ``tokenizer.json`` loads through
    ``PreTrainedTokenizerFast``, which does not import torch or the model
    registry (about 3 s saved in every EnvManagerWorker process); the rollout
    only encodes template text without special tokens, decodes, and renders the
    chat template, which the generic fast tokenizer does exactly as the model's
    own class. Anything else (hub ids, slow-only tokenizers, remote code) goes
    through ``AutoTokenizer``.
    """
    local = Path(path).expanduser()
    if not trust_remote_code and (local / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(local))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
