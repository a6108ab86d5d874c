"""The orders in which the group queue serves whole groups, one class each.

Each order needs its own bookkeeping (a cursor over the complete head groups,
or the complete groups in completion order) and its own quota rule; keeping
them here lets the queue's seat, quota and staleness rules stay free of
per-order branches, and a new order be added without touching them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar, get_args

from roll_async.config.schema import ServeOrder as ServeOrderName
from roll_async.errors import ConfigError

SERVE_ORDERS: tuple[ServeOrderName, ...] = get_args(ServeOrderName)


class QueuedGroup(Protocol):
    """What a serve order reads of a pending group."""

    group_id: int
    tag: str
    complete: bool


GroupT = TypeVar("GroupT", bound=QueuedGroup)


class ServeOrder(Protocol[GroupT]):
    """Decides, per tag, when a batch is ready and which pending groups it takes (amortized O(1) per check).

    ``pending`` is a tag's pending groups ordered by group_id; ``share`` is how many groups of the tag a
    batch takes.
    """

    def max_pending(self, quota: int, env_groups: int) -> int:
        """Groups a tag may keep pending, given its batch quota and its env groups."""
        ...

    def group_completed(self, group: GroupT) -> None:
        """A pending group completed and was kept."""
        ...

    def group_removed(self, group: GroupT, pending_index: int | None) -> None:
        """A group left the pending list (served or dropped) from ``pending_index`` (None: it was not listed)."""
        ...

    def is_ready(self, tag: str, pending: Sequence[GroupT], share: int) -> bool: ...

    def heads(self, tag: str, pending: Sequence[GroupT], share: int) -> list[GroupT]:
        """The groups of ``tag`` to serve, once ``is_ready``."""
        ...


class FifoOrder(Generic[GroupT]):
    """``fifo``: serve, per tag, the ``share`` OLDEST pending groups once they are all complete.

    A slow group is never skipped in favour of younger complete ones, so it cannot starve, and the batch is
    not biased towards short episodes. With the quota (``share * lookahead`` pending per tag) this also
    bounds staleness: a group is served at most ``lookahead`` batches after it was created. Its cost: envs
    whose tag is at quota idle until the slow head group completes (``rollout/env_busy_fraction``).
    """

    name: ServeOrderName = "fifo"

    def __init__(self, tags: Sequence[str]) -> None:
        #: Per tag, how many groups at the head of the pending list are known complete (a cursor; never rescans).
        self._lead = {tag: 0 for tag in tags}

    def max_pending(self, quota: int, env_groups: int) -> int:
        return quota

    def group_completed(self, group: GroupT) -> None:
        pass  # the cursor finds it when it reaches it

    def group_removed(self, group: GroupT, pending_index: int | None) -> None:
        if pending_index is not None and pending_index < self._lead[group.tag]:
            self._lead[group.tag] -= 1

    def is_ready(self, tag: str, pending: Sequence[GroupT], share: int) -> bool:
        lead = self._lead[tag]
        while lead < len(pending) and pending[lead].complete:
            lead += 1
        self._lead[tag] = lead
        return lead >= share

    def heads(self, tag: str, pending: Sequence[GroupT], share: int) -> list[GroupT]:
        return list(pending[:share])


class FirstCompleteOrder(Generic[GroupT]):
    """``first_complete`` (ROLL's behaviour): serve the first ``share`` groups of a tag to COMPLETE, whatever their age.

    The groups still running stay pending and continue as partial rollouts into later steps while within
    the staleness bound (then they are dropped as stale and counted). The quota per tag is raised to the
    tag's env groups when that is larger (``max(share * lookahead, env groups of the tag)``), so
    over-provisioned groups keep every env busy instead of idling. Its cost: a bias towards short (fast)
    episodes, and work lost on groups that go stale (``rollout/groups_started_earlier_fraction`` is the
    share of served groups that were already pending when the previous batch was served).
    """

    name: ServeOrderName = "first_complete"

    def __init__(self, tags: Sequence[str]) -> None:
        #: Per tag, complete (kept) pending groups in completion order.
        self._complete: dict[str, dict[int, GroupT]] = {tag: {} for tag in tags}

    def max_pending(self, quota: int, env_groups: int) -> int:
        return max(quota, env_groups) if quota > 0 else quota

    def group_completed(self, group: GroupT) -> None:
        self._complete[group.tag][group.group_id] = group

    def group_removed(self, group: GroupT, pending_index: int | None) -> None:
        self._complete[group.tag].pop(group.group_id, None)

    def is_ready(self, tag: str, pending: Sequence[GroupT], share: int) -> bool:
        return len(self._complete[tag]) >= share

    def heads(self, tag: str, pending: Sequence[GroupT], share: int) -> list[GroupT]:
        return list(itertools.islice(self._complete[tag].values(), share))


def check_serve_order(name: str) -> None:
    """Raise ConfigError unless ``name`` is one of SERVE_ORDERS."""
    if name not in SERVE_ORDERS:
        raise ConfigError(f"serve_order={name!r}: use one of {', '.join(SERVE_ORDERS)}")


def make_serve_order(name: ServeOrderName, tags: Sequence[str]) -> ServeOrder[GroupT]:
    """The serve order called ``name`` over ``tags``."""
    check_serve_order(name)
    if name == "first_complete":
        return FirstCompleteOrder(tags)
    return FifoOrder(tags)
