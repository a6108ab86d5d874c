"""The trainer's sampling transformation is vLLM's: same support, same renormalised logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError
from roll_async.sampling import SamplingSettings, sampling_logits
from roll_async.trainer.losses import token_logprobs

SETTINGS = [
    SamplingSettings(1.0, 1.0, -1),
    SamplingSettings(0.7, 1.0, -1),
    SamplingSettings(0.7, 0.9, -1),
    SamplingSettings(1.0, 1.0, 5),
    SamplingSettings(0.7, 0.9, 20),
    SamplingSettings(1.3, 0.5, 3),
]


def _vllm_processed_logprobs(
    logits: torch.Tensor, settings: SamplingSettings
) -> torch.Tensor:
    """What vLLM's CPU sampler reports in processed_logprobs mode (its own functions, no model)."""
    from vllm.v1.sample.ops.topk_topp_sampler import (
        apply_top_k_only,
        apply_top_k_top_p_pytorch,
    )

    scaled = logits.clone() / settings.temperature
    k = (
        torch.full((logits.shape[0],), settings.top_k, dtype=torch.int32)
        if settings.top_k > 0
        else None
    )
    p = torch.full((logits.shape[0],), settings.top_p) if settings.top_p < 1.0 else None
    if p is None and k is not None:
        masked = apply_top_k_only(scaled, k)
    else:
        masked = apply_top_k_top_p_pytorch(scaled, k, p, allow_cpu_sync=True)
    return masked.log_softmax(dim=-1, dtype=torch.float32)


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_sampling_logits_equal_vllms_processed_logprobs(settings):
    pytest.importorskip("vllm")
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 300, generator=generator) * 3
    logits[0, :10] = logits[0, 0]  # ties at the top-k / top-p boundary
    ours = sampling_logits(logits, settings).log_softmax(dim=-1)
    theirs = _vllm_processed_logprobs(logits, settings)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), (
        "the support differs from vLLM's"
    )
    finite = ~torch.isinf(theirs)
    assert torch.allclose(ours[finite], theirs[finite], atol=1e-5)


def test_transform_changes_logprobs_and_keeps_the_sampled_token():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    raw = logits.log_softmax(-1)
    nucleus = sampling_logits(logits, SamplingSettings(1.0, 0.6, -1)).log_softmax(-1)
    assert (
        torch.isinf(nucleus[0, 2:]).all() and nucleus[0, 0] > raw[0, 0]
    )  # renormalised over the nucleus
    kept = sampling_logits(
        logits, SamplingSettings(1.0, 0.6, -1), keep_ids=torch.tensor([3])
    ).log_softmax(-1)
    assert math.isfinite(float(kept[0, 3])), "a sampled token stays in the support"
    cold = sampling_logits(logits, SamplingSettings(0.5)).log_softmax(-1)
    assert torch.allclose(cold, (logits / 0.5).log_softmax(-1))
    assert sampling_logits(logits, SamplingSettings(0.0, 0.5, 2)) is logits, (
        "greedy reports raw logprobs, as vLLM"
    )


def test_token_logprobs_under_sampling_match_the_transform_and_have_finite_entropy():
    torch.manual_seed(0)
    vocab, hidden = 50, 16

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, hidden)
            self.head = torch.nn.Linear(hidden, vocab)

        def forward(
            self, input_ids, attention_mask=None, position_ids=None, use_cache=False
        ):
            return type("Out", (), {"logits": self.head(self.emb(input_ids)) * 4})()

    model = Tiny()
    ids = torch.randint(0, vocab, (2, 12))
    attn = torch.ones_like(ids)
    settings = SamplingSettings(0.7, 0.9, 10)
    out = token_logprobs(
        model, ids, attn, score_mask=attn, with_entropy=True, sampling=settings
    )
    logits = model(ids).logits[:, :-1].reshape(-1, vocab)
    targets = ids[:, 1:].reshape(-1)
    expected = (
        sampling_logits(logits, settings, keep_ids=targets)
        .log_softmax(-1)
        .gather(1, targets[:, None])[:, 0]
    )
    assert torch.allclose(out.logprobs[:, 1:].reshape(-1), expected, atol=1e-6)
    assert torch.isfinite(out.entropy).all() and torch.isfinite(out.logprobs).all()
    raw = token_logprobs(model, ids, attn, score_mask=attn).logprobs
    assert (raw - out.logprobs).abs().max() > 0.05


def test_generation_settings_are_validated():
    with pytest.raises(ConfigError, match="generation.top_p"):
        load_config(overrides=["generation.top_p=0"])
    with pytest.raises(ConfigError, match="logprobs_mode"):
        load_config(overrides=["engine.engine_kwargs.logprobs_mode=raw_logprobs"])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logit_bias_is_added_before_temperature_like_vllm(temperature):
    """The engine's logit bias (a VL model's input-only image token) is part of the processed distribution."""
    torch.manual_seed(0)
    logits = torch.randn(4, 32)
    settings = SamplingSettings.from_generation(
        SamplingSettings(temperature, 1.0, -1), logit_bias={5: -100.0, 7: 2.0}
    )
    assert not settings.is_raw
    expected = logits.clone()
    expected[:, 5] -= 100.0
    expected[:, 7] += 2.0
    expected = (expected / temperature).log_softmax(-1)
    got = sampling_logits(logits, settings).log_softmax(-1)
    torch.testing.assert_close(got, expected)
    unbiased = sampling_logits(
        logits, SamplingSettings(temperature, 1.0, -1)
    ).log_softmax(-1)
    assert (
        got[:, 7] - unbiased[:, 7]
    ).min() > 0.5  # the bias really moves the distribution
