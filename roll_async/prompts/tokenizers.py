"""Loading the tokenizer that renders and tokenizes a run's prompts.

Every EnvManagerWorker process, judge and check loads a tokenizer before it can
build a prompt, and loading is the costly part (transformers' model registry,
torch); the choice of the cheapest loader that renders the chat template exactly
is one decision, kept here apart from the prompt building that uses the tokenizer
(roll_async.prompts.prompt_builder). ``ChatTokenizer`` names what the package
calls on a loaded tokenizer, so the functions that take one say so in their
signatures.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class ChatTokenizer(Protocol):
    """What roll-async calls on a Hugging Face tokenizer (``PreTrainedTokenizerBase``), and nothing more.

    Each method takes only the argument shapes the package passes (one text, one
    list of ids, one token string, ``tokenize=False``) and returns what
    transformers returns for those; transformers' own hints return the union over
    every input shape (``decode`` of a batch gives a list of texts), which callers
    would otherwise narrow at every use. Arguments passed by position are
    positional-only, so test doubles may name them freely.
    """

    #: The Jinja template (a dict of named templates in some saved tokenizers); None when the model has none.
    chat_template: str | dict[str, str] | None

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    def __call__(
        self, text: str, /, *, add_special_tokens: bool = ...
    ) -> Mapping[str, list[int]]: ...

    def __len__(self) -> int: ...

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(
        self, token_ids: list[int], /, *, skip_special_tokens: bool = ...
    ) -> str: ...

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        /,
        *,
        tokenize: bool = ...,
        add_generation_prompt: bool = ...,
        chat_template: str | None = ...,
        **kwargs: Any,
    ) -> str: ...

    def convert_tokens_to_ids(self, token: str, /) -> int: ...

    def save_pretrained(self, save_directory: str | os.PathLike[str], /) -> object: ...


def load_tokenizer(path: str, trust_remote_code: bool = False) -> ChatTokenizer:
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
    # transformers is heavy: loaded only when a tokenizer is.
    if not trust_remote_code and (local / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        fast: ChatTokenizer = PreTrainedTokenizerFast.from_pretrained(str(local))
        return fast
    from transformers import AutoTokenizer

    loaded: ChatTokenizer = AutoTokenizer.from_pretrained(
        path, trust_remote_code=trust_remote_code
    )
    return loaded
