"""Where env instances sit and which seeds groups play, as pure functions of the config.

The queue, the Ray and in-process schedulers, validation, the barrier
benchmark and the run report must all agree on which env_id plays which tag and
which seed group ``i`` of a tag plays, whatever the timing; keeping those rules
here, free of any scheduling state, is what makes them agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from roll_async.errors import InvalidInputError

# for hints only: the run report reads layouts without loading the config schema
if TYPE_CHECKING:
    from roll_async.config.rollout_spec import RolloutSpec


def derive_seed(run_seed: int, namespace: str, index: int) -> int:
    """A stable 31-bit seed for item ``index`` of ``namespace`` (a tag) in a run seeded with ``run_seed``.

    Group number ``i`` of tag ``t`` plays ``derive_seed(run_seed, t, i)`` (a stable hash), so the seed
    sequence of a run is reproducible from its seed regardless of timing.
    """
    digest = hashlib.blake2b(
        f"{run_seed}/{namespace}/{index}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def split_by_weights(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainder; ties: first wins)."""
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum <= 0:
        raise InvalidInputError(
            f"weights {list(weights)} must sum to a positive number"
        )
    exact = [total * w / weight_sum for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def groups_per_tag(
    tags: Sequence[str], num_env_groups: int, num_groups_partition: Sequence[int]
) -> list[int]:
    """Env groups per tag: the partition, or ``num_env_groups`` split evenly when it is empty."""
    if num_groups_partition:
        return list(num_groups_partition)
    return split_by_weights(num_env_groups, [1] * len(tags))


def env_layout(
    tags: Sequence[str],
    num_env_groups: int,
    num_groups_partition: Sequence[int],
    group_size: int,
    group_size_redundancy: int,
) -> list[tuple[int, str]]:
    """(env_id, tag) for every env instance: ``groups[tag] * (group_size + redundancy)`` per tag, ids contiguous."""
    layout: list[tuple[int, str]] = []
    per_group = group_size + group_size_redundancy
    for tag, count in zip(
        tags, groups_per_tag(tags, num_env_groups, num_groups_partition)
    ):
        for _ in range(count * per_group):
            layout.append((len(layout), tag))
    return layout


def rollout_layout(spec: RolloutSpec) -> list[tuple[int, str]]:
    """(env_id, tag) for every env instance of one rollout side, as its env-manager section lays them out."""
    em = spec.env_manager
    return env_layout(
        em.tags,
        em.num_env_groups,
        em.num_groups_partition,
        em.group_size,
        em.group_size_redundancy,
    )


def env_groups_by_tag(spec: RolloutSpec) -> dict[str, int]:
    """tag -> env groups of one rollout side."""
    em = spec.env_manager
    return dict(
        zip(
            em.tags, groups_per_tag(em.tags, em.num_env_groups, em.num_groups_partition)
        )
    )
