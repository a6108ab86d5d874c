"""A tiny byte-level BPE tokenizer with a ChatML template, trained offline in about a second, for tests."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from roll_async.prompts.tokenizers import ChatTokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_chatml_test_tokenizer(save_dir: str | Path | None = None) -> ChatTokenizer:
    """A byte-level BPE tokenizer (~350 tokens) with a ChatML template, trained in about a second, offline."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "system user assistant You are an agent. Reply with your action inside <answer></answer>.",
        "<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer> Count up.",
        "state s1t0 s2t1 s3t2 reward 0 1 2 3 4 5 6 7 8 9 the grid is ### #P# ...",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    hf: ChatTokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )
    if save_dir is not None:
        hf.save_pretrained(str(save_dir))
    return hf
