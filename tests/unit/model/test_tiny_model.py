"""The offline tiny model: tokenizer trained on env text, ChatML template, loadable HF checkpoint."""

from __future__ import annotations

import json

import pytest

from roll_async.model.tiny import BUILD_ID, build_tiny_model


def test_tokenizer_round_trips_env_vocabulary(tokenizer):
    from roll_async.envs.corpus import sample_env_texts

    texts = sample_env_texts(num_seeds=3)
    assert texts
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_tokenizer_was_trained_on_env_text(tokenizer):
    # A byte-level tokenizer that never saw env text would spend ~1 token per character.
    sample = (
        "<answer>Up</answer> <answer>Left</answer> <search>capital of France</search>"
    )
    ids = tokenizer.encode(sample, add_special_tokens=False)
    assert len(sample) / len(ids) > 2.5


def test_unseen_characters_still_round_trip(tokenizer):
    text = "Ünïcødé ✓ 日本語 \t tabs\nnewlines"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_multi_turn_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "obs 1"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "obs 2"},
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nsys<|im_end|>\n"
        "<|im_start|>user\nobs 1<|im_end|>\n"
        "<|im_start|>assistant\n<answer>Up</answer><|im_end|>\n"
        "<|im_start|>user\nobs 2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Each turn's rendering extends the previous one: what incremental prompt building relies on.
    shorter = tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=False
    )
    assert rendered.startswith(shorter)


def test_special_tokens_are_single_ids(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_build_is_idempotent_and_model_loads(tiny_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    weights = next(tiny_model_path.glob("*.safetensors"))
    mtime = weights.stat().st_mtime_ns
    assert build_tiny_model(tiny_model_path) == tiny_model_path
    assert weights.stat().st_mtime_ns == mtime, (
        "a second build must reuse the existing directory"
    )
    info = json.loads((tiny_model_path / "roll_async_build.json").read_text())
    assert info["build_id"] == BUILD_ID

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    config = model.config
    assert config.model_type == "qwen2"
    # vLLM CPU kernels need head_dim 64
    assert config.hidden_size // config.num_attention_heads == 64
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, config.vocab_size)


@pytest.mark.parametrize("path", ["./nope/model", "/abs/missing", "a/b/c"])
def test_missing_local_model_paths_are_rejected(path):
    from roll_async.model.paths import resolve_model_path

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(path)


def test_a_zoo_family_is_named_as_tiny_family():
    from roll_async.model.families import default_family_dir
    from roll_async.model.paths import resolve_model_path

    assert resolve_model_path("tiny-qwen2_5") == str(default_family_dir("qwen2_5"))
    with pytest.raises(FileNotFoundError, match="tiny-qwen2_5, tiny-qwen3"):
        resolve_model_path("tiny-nope")
