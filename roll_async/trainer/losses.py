"""Token-level policy-gradient loss: clipped PPO surrogate, truncated importance sampling, k3 KL.

In async RL the engine that sampled a token may have run older weights and
different kernels than the trainer, so the loss must correct for that mismatch
exactly once; the pieces here (and :func:`clipped_surrogate`'s docstring, the
formula) keep that correction and the batch aggregation in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll_async.errors import ConfigError, InvalidInputError
from roll_async.sampling import SamplingSettings, sampling_logits
from roll_async.trainer.collate import TrajectoryBatch

LOSS_AGGREGATIONS = ("token_mean", "seq_mean")


@dataclass
class TokenLogprobs:
    """Per-token log-probabilities aligned with ``input_ids`` ([batch, seq]; position 0 is 0)."""

    logprobs: torch.Tensor
    #: Per-token entropy of the next-token distribution (detached), same layout; None unless asked for.
    entropy: torch.Tensor | None = None


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    *,
    score_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
    sampling: SamplingSettings | None = None,
    model_inputs: dict[str, torch.Tensor] | None = None,
) -> TokenLogprobs:
    """Log-probability of each token given its prefix, from one forward pass.

    The logits at position ``t - 1`` predict token ``t``, so ``out[:, t]`` is
    ``log p(input_ids[:, t] | input_ids[:, :t])`` and ``out[:, 0]`` is 0 (no
    prefix). Only positions in ``score_mask`` (default: ``attention_mask``) go
    through the log-softmax, which keeps the ``[tokens, vocab]`` float32
    temporary as small as the response. Right padding is assumed. ``model_inputs`` adds inputs such as a
    vision-language model's ``pixel_values``. ``attention_mask=None`` with ``position_ids`` that restart
    at 0 is a packed sequence (:func:`roll_async.trainer.micro_batches.packed_token_logprobs`); it then
    needs ``score_mask``.

    ``sampling`` scores under the distribution the engine sampled from
    (temperature, top-k, top-p, renormalised; :mod:`roll_async.sampling`), the
    one whose logprobs the engine reports; None means the raw softmax. The
    entropy is that of the same distribution.
    """
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **(model_inputs or {}),
    )
    logits = outputs.logits
    if score_mask is None and attention_mask is None:
        raise InvalidInputError(
            "token_logprobs needs score_mask when attention_mask is None"
        )
    mask = score_mask if score_mask is not None else attention_mask
    assert mask is not None  # checked above
    wanted = mask.bool()
    select = wanted[:, 1:]
    shifted = torch.zeros(select.shape, dtype=torch.float32, device=logits.device)
    shifted_entropy = torch.zeros_like(shifted) if with_entropy else None
    if select.any():
        targets = input_ids[:, 1:][select]
        picked = logits[:, :-1][select].float()  # [n, vocab]
        if sampling is not None:
            picked = sampling_logits(picked, sampling, keep_ids=targets)
        log_norm = torch.logsumexp(picked, dim=-1)
        values = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
        shifted = shifted.masked_scatter(select, values)
        if shifted_entropy is not None:
            with torch.no_grad():
                finite = picked.masked_fill(
                    torch.isinf(picked), 0.0
                )  # removed tokens have p = 0
                ent = log_norm - (torch.softmax(picked, dim=-1) * finite).sum(-1)
                shifted_entropy = shifted_entropy.masked_scatter(select, ent)
    first = torch.zeros((select.shape[0], 1), dtype=torch.float32, device=logits.device)
    out = torch.cat([first, shifted], dim=1)
    entropy = (
        torch.cat([first, shifted_entropy], dim=1)
        if shifted_entropy is not None
        else None
    )
    return TokenLogprobs(out, entropy)


def truncated_importance_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, tis_cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(exp(prox - behav), tis_cap), raw ratio)``, both detached; ``tis_cap == 0`` gives weights 1.

    The log-ratio is clamped to +-20 before ``exp`` so a wild mismatch shows as a huge ratio, not inf.
    """
    raw = torch.exp((prox_logp - behav_logp).detach().clamp(-20.0, 20.0))
    if tis_cap <= 0:
        return torch.ones_like(raw), raw
    return raw.clamp(max=tis_cap), raw


def clipped_surrogate(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``-min(r A, clip(r) A)`` with ``r = exp(logp - prox_logp)``.

    Returns ``(loss, ratio, clipped)`` where ``clipped`` marks tokens whose
    gradient the clip removed (A > 0 with r > 1 + high, or A < 0 with r < 1 - low).

    Three log-probabilities of each response token meet here:

    * ``logp``       current policy, with gradient (the trainer's forward pass now);
    * ``prox_logp``  the trainer's own policy *before this step's update*
      (detached). PPO's "old" policy. With ``ppo_epochs == 1`` it equals ``logp``
      in value, so it costs no extra forward pass;
    * ``behav_logp`` the behaviour policy: what the engine reported while sampling
      (``TrajectoryBatch.old_logprobs``). It differs from ``prox_logp`` because
      the engine's kernels differ from the trainer's and, in async mode, because
      the engine may have run older weights.

    The per-token loss (decoupled PPO, as in AReaL, with verl's TIS weight) is::

        r    = exp(logp - prox_logp)                              # clipped: the PPO trust region
        w    = min(exp(prox_logp - behav_logp), tis_cap)          # truncated: the off-policy correction
        L_t  = -w * min(r * A, clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high) * A)
        L_t += kl_coef * (exp(ref_logp - logp) - (ref_logp - logp) - 1)   # k3 KL, only when kl_coef > 0

    ``r`` is the ratio that is *clipped*; ``w`` is the ratio that is *truncated*
    (and detached: it reweights samples, it is not optimised). The clip is taken
    around the trainer's proximal policy rather than around the behaviour policy
    so the mismatch is counted once: clipping against ``behav_logp`` *and*
    weighting by ``w`` would apply the correction twice. With one PPO epoch, ``r``
    is 1 in value and its gradient is ``A * grad logp``, so the whole off-policy
    correction is ``w``, the truncated ratio of Yao et al., "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training" (verl's TIS). ``tis_cap
    == 0`` turns the correction off (``w = 1``).
    """
    ratio = torch.exp(logp - prox_logp.detach())
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(
        1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    )
    loss = torch.maximum(unclipped, clipped_loss)
    with torch.no_grad():
        clipped = ((advantages > 0) & (ratio > 1.0 + clip_ratio_high)) | (
            (advantages < 0) & (ratio < 1.0 - clip_ratio_low)
        )
    return loss, ratio.detach(), clipped


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(d) - d - 1`` with ``d = ref - logp`` (>= 0, unbiased)."""
    delta = (ref_logp.detach() - logp).clamp(-20.0, 20.0)
    return torch.exp(delta) - delta - 1.0


@dataclass
class LossNormalizer:
    """Full-batch denominators, so a micro-batch's loss is its exact share of the batch loss."""

    num_tokens: float
    num_sequences: float

    @classmethod
    def for_mask(cls, response_mask: torch.Tensor) -> LossNormalizer:
        mask = response_mask.bool()
        return cls(
            num_tokens=float(max(int(mask.sum().item()), 1)),
            num_sequences=float(max(int(mask.any(dim=1).sum().item()), 1)),
        )


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, agg: str, normalizer: LossNormalizer
) -> torch.Tensor:
    """Reduce per-token ``values`` over ``mask`` by ``token_mean`` or ``seq_mean``.

    Aggregation over ``response_mask``: ``token_mean`` divides the sum over all
    response tokens of the whole batch by their count; ``seq_mean`` averages each
    sequence's token mean over the sequences that have response tokens. Both take
    the full-batch denominator explicitly, so micro-batch losses add up to exactly
    the full-batch loss.
    """
    weights = mask.to(values.dtype)
    if agg == "token_mean":
        return (values * weights).sum() / normalizer.num_tokens
    if agg == "seq_mean":
        per_seq = (values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return per_seq.sum() / normalizer.num_sequences
    raise ConfigError(
        f"loss aggregation {agg!r} is unknown; use one of {', '.join(LOSS_AGGREGATIONS)}"
    )


def scored_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """Response tokens that can be scored: position 0 has no prefix to predict it from."""
    mask = response_mask.bool().clone()
    mask[:, 0] = False
    return mask


def token_lag(batch: TrajectoryBatch) -> torch.Tensor | None:
    """``policy_version - token_version`` per token ([batch, seq]; -1 where the version is unknown).

    None when the batch lacks per-token versions or the policy version (hand-built batches).
    """
    if batch.token_versions is None or batch.policy_version is None:
        return None
    versions = batch.token_versions.to(batch.response_mask.device)
    return torch.where(
        versions >= 0,
        (batch.policy_version - versions).clamp(min=0),
        torch.full_like(versions, -1),
    )
