"""Each rank's share of a rollout batch, and the reductions that turn per-rank sums into batch figures.

Every rank receives the whole batch and computes the same advantages, loss
denominators and micro-batch plan from it, so a rank's micro-batch loss is its
exact share of the full-batch loss; FSDP2 then *sums* gradients across ranks
(:func:`roll_async.trainer.parallel.sharding.shard_model`) and the result equals
one process's gradient. FSDP2 all-gathers parameters in every forward, so every
rank must run the same number of passes: a rank with fewer micro-batches runs
empty passes (``None``) that contribute zero gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from roll_async.errors import InvalidInputError
from roll_async.trainer.parallel.process_group import RankInfo

T = TypeVar("T")


def assign_to_ranks(token_counts: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of the micro-batches each rank runs, balanced by tokens (deterministic, so equal on every rank).

    Largest first, each to the rank with the fewest tokens so far (lowest rank on ties);
    each rank's list keeps plan order.
    """
    if world_size < 1:
        raise InvalidInputError(f"world_size={world_size} must be >= 1")
    load = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    order = sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i))
    for index in order:
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shares[rank].append(index)
        load[rank] += token_counts[index]
    return [sorted(share) for share in shares]


def rank_share(
    items: Sequence[T], token_counts: Sequence[int], info: RankInfo
) -> list[T | None]:
    """This rank's items, padded with ``None`` to the longest share so every rank runs as many passes."""
    shares = assign_to_ranks(token_counts, info.world_size)
    passes = max((len(share) for share in shares), default=0)
    mine: list[T | None] = [items[i] for i in shares[info.rank]]
    return mine + [None] * (passes - len(mine))


def _reduce(
    values: Mapping[str, float], info: RankInfo, op: dist.ReduceOp.RedOpType
) -> dict[str, float]:
    """Each key reduced over the ranks: a CPU float64 tensor, which gloo carries on CPU and GPU ranks alike.

    Every rank must pass the same keys: the tensors are matched by position.
    """
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if info.world_size > 1:
        dist.all_reduce(tensor, op=op)
    return dict(zip(keys, tensor.tolist()))


def sum_across_ranks(values: Mapping[str, float], info: RankInfo) -> dict[str, float]:
    """Each key summed over the ranks."""
    return _reduce(values, info, dist.ReduceOp.SUM)


def max_across_ranks(values: Mapping[str, float], info: RankInfo) -> dict[str, float]:
    """Each key's maximum over the ranks."""
    return _reduce(values, info, dist.ReduceOp.MAX)


def all_ranks_agree(flag: bool, info: RankInfo) -> bool:
    """True only if ``flag`` holds on every rank (a rank that stops alone would leave the others in a collective)."""
    return max_across_ranks({"bad": 0.0 if flag else 1.0}, info)["bad"] == 0.0
