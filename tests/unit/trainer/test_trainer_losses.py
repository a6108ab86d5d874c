"""The loss pieces: clipping, truncated importance weights, aggregation, k3 KL, shifted log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from roll_async.trainer.losses import (
    LossNormalizer,
    aggregate,
    clipped_surrogate,
    k3_kl,
    token_logprobs,
    truncated_importance_weights,
)

LOW, HIGH = 0.2, 0.28


def _grad_of_surrogate(ratio: float, advantage: float) -> tuple[float, bool]:
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, _, clipped = clipped_surrogate(
        logp,
        torch.zeros(1, 1),
        torch.tensor([[advantage]]),
        clip_ratio_low=LOW,
        clip_ratio_high=HIGH,
    )
    loss.sum().backward()
    return float(logp.grad), bool(clipped)


@pytest.mark.parametrize(
    "ratio, advantage, clipped",
    [
        (1.5, +1.0, True),  # above 1 + high with A > 0: no further push up
        (
            1.5,
            -1.0,
            False,
        ),  # above the range with A < 0: the pessimistic branch keeps the gradient
        (0.5, -1.0, True),  # below 1 - low with A < 0: no further push down
        (0.5, +1.0, False),
        (1.1, +1.0, False),
        (1.1, -1.0, False),
        (0.79, -1.0, True),  # the low side uses clip_ratio_low (0.8), not high
        (1.25, +1.0, False),  # inside the asymmetric high bound (1.28)
    ],
)
def test_clip_removes_gradient_only_on_the_right_side(ratio, advantage, clipped):
    grad, was_clipped = _grad_of_surrogate(ratio, advantage)
    assert was_clipped == clipped
    if clipped:
        assert grad == 0.0
    else:
        # d/dlogp of -A * r = -A * r
        assert grad == pytest.approx(-advantage * ratio, rel=1e-5)


def test_truncated_importance_weights_cap_and_disable():
    prox = torch.zeros(1, 3)
    behav = torch.log(torch.tensor([[0.1, 2.0, 1.0]]))  # raw ratios 10, 0.5, 1
    weights, raw = truncated_importance_weights(prox, behav, tis_cap=2.0)
    assert raw.tolist()[0] == pytest.approx([10.0, 0.5, 1.0], rel=1e-5)
    assert weights.tolist()[0] == pytest.approx([2.0, 0.5, 1.0], rel=1e-5)
    off, _ = truncated_importance_weights(prox, behav, tis_cap=0.0)
    assert off.tolist()[0] == [1.0, 1.0, 1.0]
    prox_grad = torch.zeros(1, 3, requires_grad=True)
    assert not truncated_importance_weights(prox_grad, behav, 2.0)[0].requires_grad


def test_aggregations_by_hand_and_normalizer():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    norm = LossNormalizer.for_mask(mask)
    assert (norm.num_tokens, norm.num_sequences) == (4.0, 2.0)
    assert float(aggregate(values, mask, "token_mean", norm)) == pytest.approx(
        (1 + 2 + 3 + 4) / 4
    )
    assert float(aggregate(values, mask, "seq_mean", norm)) == pytest.approx(
        (2.0 + 4.0) / 2
    )
    with pytest.raises(ValueError, match="unknown"):
        aggregate(values, mask, "sum", norm)


def test_k3_kl_is_zero_at_equality_and_matches_formula():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -3.0])
    d = ref - logp
    expected = torch.exp(d) - d - 1
    got = k3_kl(logp, ref)
    assert got.tolist() == pytest.approx(expected.tolist(), rel=1e-6)
    assert got[0] == 0 and (got >= 0).all()


class _LookupModel(torch.nn.Module):
    """logits[t] depend only on token t, so the expected shifted log-probs are easy to write down."""

    def __init__(self, vocab: int = 7) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(
            torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
        )

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, use_cache=False
    ):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_token_logprobs_are_shifted_and_masked():
    model = _LookupModel()
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    score = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0]])
    out = token_logprobs(model, ids, attn, score_mask=score, with_entropy=True)
    table = torch.log_softmax(model.table.detach(), dim=-1)
    expected = torch.zeros(2, 4)
    expected[0, 2] = table[2, 3]  # token 3 predicted from the logits at token 2
    expected[0, 3] = table[3, 4]
    expected[1, 1] = table[5, 6]
    assert torch.allclose(out.logprobs.detach(), expected, atol=1e-6)
    probs = table.exp()
    assert float(out.entropy[0, 2]) == pytest.approx(
        float(-(probs[2] * table[2]).sum()), rel=1e-5
    )
    assert out.entropy[0, 0] == 0 and out.entropy[0, 1] == 0
    out.logprobs.sum().backward()
    # padding never scored
    assert model.table.grad is not None and model.table.grad[0].abs().sum() == 0
