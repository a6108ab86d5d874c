"""Which rows of a rollout batch go through the model together, and the packed forward pass that runs them.

A rollout batch mixes short and long trajectories. Chunks of ``trainer.micro_batch_size`` rows padded to
their longest row spend most of a pass on padding when lengths are skewed, so with
``trainer.max_tokens_per_micro_batch`` the rows are grouped by a token budget instead
(:func:`plan_micro_batches`) and each group runs as ONE sequence of its rows laid end to end
(:func:`packed_token_logprobs`): position ids restart at 0 for every row and no attention mask is
given, from which transformers builds a block-diagonal causal mask, so no row sees another and
no padding is computed. The result is laid back out as the padded call's, so a caller can use either.

A plan is a pure function of the rows' lengths: every process that plans the same batch gets the
same micro-batches, which is what lets several ranks split one plan between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from roll_async.errors import ConfigError, InvalidInputError
from roll_async.sampling import SamplingSettings
from roll_async.trainer.losses import TokenLogprobs, token_logprobs

#: Attention implementations that honour transformers' packed-sequence detection (position ids that
#: restart at 0 with no attention mask): the mask-building ones through masking_utils, flash attention
#: through its varlen path.
PACKING_ATTENTION = frozenset({"sdpa", "eager", "flash_attention_2", "flex_attention"})


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass: which rows of the batch, and how many real tokens they hold."""

    #: Row indices into the batch, ascending.
    rows: tuple[int, ...]
    #: Sum of the rows' lengths (their attention_mask sums).
    tokens: int


def plan_micro_batches(
    lengths: Sequence[int], *, micro_batch_size: int, max_tokens: int = 0
) -> list[MicroBatch]:
    """Group the rows of a batch whose rows hold ``lengths`` tokens into micro-batches.

    ``max_tokens == 0``: consecutive chunks of ``micro_batch_size`` rows, in order.
    ``max_tokens > 0``: first-fit decreasing by length (ties by row index), so every micro-batch's
    tokens are at most ``max_tokens``; ``micro_batch_size`` is ignored. Micro-batches are ordered by
    their first row, rows ascending within each. Rows of length 0 join the first micro-batch (they
    cost nothing). Deterministic: equal ``lengths`` give equal plans on every process.

    Raises ConfigError for a row longer than ``max_tokens`` (it fits in no micro-batch).
    """
    lengths = [int(n) for n in lengths]
    if any(n < 0 for n in lengths):
        raise InvalidInputError(f"row lengths must be >= 0, got {lengths}")
    if max_tokens < 0:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={max_tokens}: must be >= 0 (0: micro_batch_size rows per pass)"
        )
    if max_tokens == 0:
        if micro_batch_size < 1:
            raise ConfigError(
                f"trainer.micro_batch_size={micro_batch_size}: must be >= 1"
            )
        return [
            MicroBatch(
                rows=tuple(range(start, min(start + micro_batch_size, len(lengths)))),
                tokens=sum(lengths[start : start + micro_batch_size]),
            )
            for start in range(0, len(lengths), micro_batch_size)
        ]
    longest = max(lengths, default=0)
    if longest > max_tokens:
        row = lengths.index(longest)
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={max_tokens} is below the length of batch row {row} "
            f"({longest} tokens), which then fits in no micro-batch; raise it to at least the rollout's "
            "sequence_length, or set it to 0 to micro-batch by trainer.micro_batch_size"
        )
    bins: list[list[int]] = []
    totals: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[row]
        for b, total in enumerate(totals):
            if total + n <= max_tokens:
                bins[b].append(row)
                totals[b] += n
                break
        else:
            bins.append([row])
            totals.append(n)
    plan = [MicroBatch(rows=tuple(sorted(b)), tokens=t) for b, t in zip(bins, totals)]
    return sorted(plan, key=lambda mb: mb.rows[0])


def model_supports_packing(model: torch.nn.Module) -> bool:
    """Whether ``model`` computes a packed sequence exactly as its rows one by one.

    True for a text-only HF model whose attention implementation honours the installed transformers'
    packed-sequence detection (``transformers.masking_utils.find_packed_sequence_indices``); False for
    vision-language models (a ``vision_config``: image features are placed by the padded layout), for
    other attention implementations, and for transformers versions without that detection.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "vision_config", None) is not None:
        return False
    attention = getattr(config, "_attn_implementation", None)
    return attention in PACKING_ATTENTION


def packed_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    rows: Sequence[int],
    *,
    score_mask: torch.Tensor,
    with_entropy: bool = False,
    sampling: SamplingSettings | None = None,
) -> TokenLogprobs:
    """:func:`~roll_async.trainer.losses.token_logprobs` of ``rows``, from one forward over them packed.

    ``input_ids``, ``attention_mask``, ``position_ids`` and ``score_mask`` are the whole batch's
    ([batch, seq], right padding); row ``i`` holds ``L_i = attention_mask[i].sum()`` tokens and its
    position ids must be ``0..L_i-1``. The rows are laid end to end in one ``[1, sum L_i]`` sequence
    with their own position ids and no attention mask, so transformers masks attention block-diagonally
    (the model must :func:`model_supports_packing`). The first token of each row is never scored (in the
    packed sequence it would be "predicted" from the row before).

    Returns ``[len(rows), width]`` tensors (``width`` = the longest of the rows, at least 1), laid out
    exactly as ``token_logprobs`` on ``input_ids[rows][:, :width]`` would return them: 0 off the scored
    positions and on padding. Log-probs keep their graph to the model's weights.
    """
    device = input_ids.device
    index = torch.as_tensor(list(rows), dtype=torch.long, device=device)
    lengths = attention_mask.index_select(0, index).sum(dim=1)
    width = max(int(lengths.max().item()) if len(rows) else 0, 1)
    # valid[k, j]: column j of the k-th row holds a token; the packed sequence is these in row-major order.
    valid = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    ids = input_ids.index_select(0, index)[:, :width][valid]
    positions = position_ids.index_select(0, index)[:, :width][valid]
    expected = torch.arange(width, device=device).expand(len(rows), width)[valid]
    if not torch.equal(positions, expected):
        raise InvalidInputError(
            "packed_token_logprobs needs each row's position ids to be 0..L-1 over its L tokens (right "
            "padding, as collate_trajectories makes them); these rows' are not"
        )
    scored = score_mask.index_select(0, index)[:, :width].bool() & valid
    scored[:, 0] = (
        False  # a row's first token would be scored from the previous row's last
    )
    total = ids.numel()
    if total == 0:
        zeros = torch.zeros((len(rows), width), dtype=torch.float32, device=device)
        return TokenLogprobs(zeros, zeros.clone() if with_entropy else None)
    packed = token_logprobs(
        model,
        ids.unsqueeze(0),
        attention_mask=None,
        position_ids=positions.unsqueeze(0),
        score_mask=scored[valid].unsqueeze(0),
        with_entropy=with_entropy,
        sampling=sampling,
    )
    # Back to the padded layout: gather each (row, column) from the packed sequence; padding reads an
    # appended 0. A gather keeps the log-probs' graph.
    source = torch.full((len(rows), width), total, dtype=torch.long, device=device)
    source[valid] = torch.arange(total, device=device)

    def unpack(values: torch.Tensor) -> torch.Tensor:
        flat = torch.cat([values[0], values.new_zeros(1)])
        return flat[source]

    return TokenLogprobs(
        unpack(packed.logprobs),
        unpack(packed.entropy) if packed.entropy is not None else None,
    )
