"""Zoo-family tokenizers for fast tests: each family's special tokens, added tokens and chat template on a small byte-level BPE trained in well under a second (the zoo's own tokenizers train on the env corpus and come with a model build)."""

from __future__ import annotations

import functools

from roll_async.model.families import FAMILIES
from roll_async.prompts.tokenizers import ChatTokenizer

_CORPUS = (
    "user assistant system turn reply one two grid state <answer>Up</answer> You are an agent. "
    'get_weather {"name": "get_weather", "arguments": {"city": "Paris"}} parameters sunny tool'
)


@functools.cache
def build_family_test_tokenizer(name: str) -> ChatTokenizer:
    """The family ``name``'s tokens and template on a 400-token BPE (cached per process)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    family = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=family.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 20, trainer)
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in family.added_tokens]
    )
    built: ChatTokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        bos_token=family.bos_token,
        chat_template=family.chat_template,
        clean_up_tokenization_spaces=False,
    )
    return built
