"""docs/trainer-sizing.md is benchmarks/trainer_sizing.py's output, and the arithmetic behind it holds."""

from __future__ import annotations

import pytest

from benchmarks.trainer_sizing import (
    BY_NAME,
    GIB,
    MODELS,
    PAGE,
    PRECISIONS,
    REGENERATE_COMMAND,
    TUNINGS,
    cross_check_rows,
    ranks_of,
    render,
    size,
)


def test_the_checked_in_sizing_page_is_the_generated_one():
    assert PAGE.is_file(), f"{PAGE} is missing; write it with `{REGENERATE_COMMAND}`"
    assert PAGE.read_text() == render(), (
        f"{PAGE} differs from benchmarks/trainer_sizing.py; regenerate it with "
        f"`{REGENERATE_COMMAND}` and commit the result"
    )


@pytest.mark.parametrize(
    ("name", "published_b"),
    [
        ("Qwen2.5-0.5B", 0.49),
        ("Qwen2.5-7B", 7.62),
        ("Qwen3-0.6B", 0.60),
        ("Qwen3-8B", 8.19),
    ],
)
def test_parameter_counts_match_the_published_totals(name, published_b):
    total = BY_NAME[name].total_params() / 1e9
    assert total == pytest.approx(published_b, rel=0.02)


def test_every_model_is_within_2_percent_of_its_card():
    for arch in MODELS:
        assert arch.total_params() / 1e9 == pytest.approx(
            arch.published_total_b, rel=0.02
        ), arch.name
        if arch.published_non_embedding_b is not None:
            assert arch.non_embedding_params() / 1e9 == pytest.approx(
                arch.published_non_embedding_b, rel=0.02
            ), arch.name


def test_qwen3_0_6b_without_embeddings():
    assert BY_NAME["Qwen3-0.6B"].non_embedding_params() / 1e9 == pytest.approx(
        0.44, rel=0.02
    )


@pytest.mark.parametrize("strategy", ["fsdp2x2", "fsdp2x4", "fsdp2x8"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("tuning", TUNINGS)
def test_fsdp2_shards_are_the_single_rank_terms_over_n(strategy, precision, tuning):
    n = ranks_of(strategy)
    for arch in MODELS:
        one = size(arch, "single", precision, tuning)
        sharded = size(arch, strategy, precision, tuning)
        for term in ("param_shard", "grad_shard", "optim_shard"):
            assert getattr(sharded, term) == pytest.approx(
                getattr(one, term) / n, abs=1
            ), (arch.name, term)
        # Activations and logits are per micro-batch, not sharded.
        assert sharded.activations == one.activations
        assert sharded.logits == one.logits


def test_full_fine_tuning_terms_per_parameter():
    arch = BY_NAME["Qwen2.5-7B"]
    p = arch.total_params()
    s = size(arch, "single", "fp32", "full")
    assert (s.param_shard, s.grad_shard, s.optim_shard) == (4 * p, 4 * p, 8 * p)
    assert s.param_working == 0
    bf = size(arch, "single", "bf16", "full")
    # fp32 master weights, gradients and AdamW state whatever the compute dtype.
    assert (bf.param_shard, bf.grad_shard, bf.optim_shard) == (4 * p, 4 * p, 8 * p)
    # autocast's bf16 copies of the matmul weights and the head (the embedding lookup is not cast).
    matmuls = arch.num_hidden_layers * arch.layer_linear_params()
    assert bf.param_working == 2 * (matmuls + arch.vocab_size * arch.hidden_size)


def test_lora_holds_the_base_in_the_compute_dtype_and_only_adapters_train():
    arch = BY_NAME["Qwen3-8B"]
    p, a = arch.total_params(), arch.lora_params()
    s = size(arch, "single", "bf16", "lora")
    assert s.param_shard == 2 * p + 4 * a
    assert (s.grad_shard, s.optim_shard) == (4 * a, 8 * a)
    # rank 16 on q, k, v, o of Qwen3-8B: 16 * (4096+4096 + 2*(4096+1024) + 4096+4096) * 36
    assert a == 16 * (8192 + 2 * 5120 + 8192) * 36


def test_checkpointing_keeps_one_layer_of_full_activations():
    arch = BY_NAME["Qwen3-0.6B"]
    tokens = 4096
    ckpt = size(arch, "single", "bf16", "full", tokens=tokens)
    full = size(arch, "single", "bf16", "full", tokens=tokens, checkpointing=False)
    per_layer = arch.layer_activation_bytes_per_token(2) * tokens
    assert full.activations == arch.num_hidden_layers * per_layer
    hidden = arch.num_hidden_layers * tokens * arch.hidden_size * 2
    assert ckpt.activations == hidden + per_layer
    assert ckpt.logits == tokens * arch.vocab_size * (2 + 4)


def test_the_page_claims_hold():
    """What the page's prose says about the tables."""
    # Published peaks lie between the estimate with and without its logits term.
    for name, setup, _source, _tokens, published, s in cross_check_rows():
        assert (s.total - s.logits) / GIB < published < s.total / GIB, (name, setup)
    # verl's minimum GPUs: a 7B's full fine-tuning needs 2, its LoRA fits on one.
    qwen7 = BY_NAME["Qwen2.5-7B"]
    for precision in PRECISIONS:
        assert not size(qwen7, "single", precision, "full").fits
        assert size(qwen7, "fsdp2x2", precision, "full").fits
        assert size(qwen7, "single", precision, "lora").fits
