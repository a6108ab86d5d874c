"""The tiny models' tokenizer recipe: byte-level BPE trained locally on the envs' own text.

Every offline tiny model (the text model, the vision-language one and the
family zoo) needs a tokenizer without a hub download; training one here on what
the envs show and expect keeps token counts small and realistic, and each model
passes its own special tokens and chat template.
"""

from __future__ import annotations

from typing import Any

from roll_async.envs.corpus import sample_env_texts

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text every env shares: chat roles, answer/search tags, action words, digits, grid symbols.
_BASE_TEXT = """\
system user assistant
You are an agent solving a task step by step. Reply with your action inside <answer></answer>.
<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer>
<answer>up</answer> <answer>down</answer> <answer>left</answer> <answer>right</answer>
<search>query</search> <answer>answer</answer> <think>reasoning</think> <image>
Up || Down || Left || Right
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 20 25 50 100 + - * / ( ) = # _ . , : ; ! ? ' "
# _ O X P S G H F @ * √ . wall box target player goal hole frozen
The answer is correct. The answer is wrong. Invalid action. Your action was invalid.
reward: -0.1 1.0 10.0 success turn step
"""


def tokenizer_training_corpus() -> list[str]:
    """Texts the tokenizer is trained on: the shared base text plus renders of every built-in env."""
    return [_BASE_TEXT] * 4 + sample_env_texts()


def train_tokenizer(
    vocab_size: int,
    *,
    special_tokens: list[str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    bos_token: str | None = None,
    additional_special_tokens: list[str] | None = None,
    added_tokens: list[str] | None = None,
) -> Any:
    """The byte-level BPE recipe; the defaults are the tiny Qwen2 model's, the family zoo passes its own tokens."""
    # tokenizers and transformers are heavy: loaded only when a model is built.
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    special_tokens = SPECIAL_TOKENS if special_tokens is None else special_tokens
    additional = (
        ["<|im_start|>"]
        if additional_special_tokens is None
        else additional_special_tokens
    )

    tok = Tokenizer(models.BPE(unk_token=None))
    # Byte-level: every string round-trips, even characters the corpus never showed.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_training_corpus(), trainer=trainer)
    # ordinary (not special) added tokens, e.g. Qwen3's <think>: kept when decoding
    if added_tokens:
        tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t in added_tokens]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=None,
        bos_token=bos_token,
        additional_special_tokens=additional,
        chat_template=chat_template,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
