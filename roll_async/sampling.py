"""The sampling distribution: temperature, top-k and top-p exactly as vLLM's sampler applies them.

The engine reports each token's logprob under its processed distribution
(``logprobs_mode="processed_logprobs"``); the trainer scores with the same
transformation, so the importance ratio is ~1 right after a weight sync at any
sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# torch only where tensors are transformed: config validation imports this module
if TYPE_CHECKING:
    import torch

#: vLLM's ``_SAMPLING_EPS``: temperatures below it mean greedy decoding.
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingSettings:
    """The settings that shape the sampling distribution (what ``generation.*`` sets for training rollouts)."""

    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 (or 0) disables top-k, as in vLLM.
    top_k: int = -1
    #: (token id, bias) pairs added to the logits before everything else, as vLLM's ``logit_bias``
    #: (the engine's own bias on a VL model's input-only image token: roll_async.prompts.images).
    logit_bias: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_generation(
        cls, generation: Any, logit_bias: dict[int, float] | None = None
    ) -> SamplingSettings:
        """From a ``GenerationConfig`` (or anything with temperature / top_p / top_k), plus the engine's logit bias."""
        bias = tuple(sorted((int(k), float(v)) for k, v in (logit_bias or {}).items()))
        return cls(
            float(generation.temperature),
            float(generation.top_p),
            int(generation.top_k),
            bias,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def is_raw(self) -> bool:
        """True when the processed distribution is the model's raw softmax (nothing to transform)."""
        return self.greedy or (
            self.temperature == 1.0
            and self.top_p >= 1.0
            and self.top_k <= 0
            and not self.logit_bias
        )

    def problem(self) -> str | None:
        """What is wrong with these settings, or None (used by config validation)."""
        if not self.temperature >= 0.0:
            return f"temperature={self.temperature} must be >= 0 (0 is greedy)"
        if not 0.0 < self.top_p <= 1.0:
            return f"top_p={self.top_p} must be in (0, 1]"
        if self.top_k < -1:
            return f"top_k={self.top_k} must be -1 (off) or a positive number of tokens"
        return None


def sampling_logits(
    logits: torch.Tensor,
    settings: SamplingSettings,
    keep_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of the sampling distribution (``[n, vocab]``; removed tokens are ``-inf``).

    ``log_softmax`` of the result is what vLLM reports as ``processed_logprobs``.
    ``keep_ids`` (``[n]``, e.g. the tokens that were sampled) are never removed:
    the engine did sample them, so they are in its support; a logit that differs
    by float noise between engine and trainer at the top-p boundary must not turn
    a sampled token's logprob into ``-inf``.

    The engine samples each token from a *processed* distribution: logits divided
    by the temperature, then top-k and top-p masking, renormalised. The engine runs
    with ``logprobs_mode="processed_logprobs"`` (see ``engine/engine_args.py``), so
    the behaviour logprob it reports for a token is that token's log-probability
    under this processed distribution. The trainer scores its tokens with
    :func:`sampling_logits`, the same transformation, so the importance ratio
    ``pi_train / pi_behaviour`` is ~1 right after a weight sync at any sampling
    settings (and the loss's gradient is that of the distribution that sampled).

    The order and tie rules follow ``vllm/v1/sample/ops/topk_topp_sampler.py``
    (``apply_top_k_top_p_pytorch``, the path vLLM takes on CPU and without
    Triton): temperature first; top-k keeps every logit >= the k-th largest (ties
    kept); top-p then sorts the top-k-masked logits ascending and removes those
    whose cumulative probability is <= ``1 - top_p``, always keeping the largest.
    A temperature below ``GREEDY_EPS`` is greedy decoding: vLLM then reports raw
    logprobs, and so does the transformation.
    """
    import torch

    if settings.is_raw:
        return logits
    if settings.logit_bias:  # vLLM adds the bias before temperature and top-k/top-p
        ids = torch.tensor(
            [token for token, _ in settings.logit_bias], device=logits.device
        )
        bias = torch.tensor(
            [value for _, value in settings.logit_bias],
            dtype=logits.dtype,
            device=logits.device,
        )
        logits = logits.index_add(-1, ids, bias.expand(*logits.shape[:-1], -1))
    scaled = logits / settings.temperature
    vocab = scaled.shape[-1]
    removed = torch.zeros_like(scaled, dtype=torch.bool)
    if 0 < settings.top_k < vocab:
        kth_largest = scaled.topk(settings.top_k, dim=-1).values[..., -1:]
        removed |= scaled < kth_largest
    if settings.top_p < 1.0:
        after_top_k = scaled.masked_fill(removed, float("-inf"))
        ascending, order = after_top_k.sort(dim=-1, descending=False)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1.0 - settings.top_p
        drop_sorted[..., -1] = False  # the most likely token always stays
        removed |= torch.zeros_like(removed).scatter(-1, order, drop_sorted)
    if keep_ids is not None:
        removed.scatter_(-1, keep_ids.unsqueeze(-1), False)
    return scaled.masked_fill(removed, float("-inf"))
