"""Loading the tokenizer that renders and tokenizes a run's prompts.

Every EnvManagerWorker process, judge and check loads a tokenizer before it can
build a prompt, and loading is the costly part (transformers' model registry,
torch); the choice of the cheapest loader that renders the chat template exactly
is one decision, kept here apart from the prompt building that uses the tokenizer
(roll_async.prompts.prompt_builder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
    # transformers is heavy: loaded only when a tokenizer is.
    if not trust_remote_code and (local / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(local))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
