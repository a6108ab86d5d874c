"""The group queue's bookkeeping of groups: each group's seats and trajectories, and the groups pending per tag.

Seat assignment, completion, serving and worker restarts all read and change
the same pending groups; keeping the records and their indexes (per tag, by id,
the open ones) in one place lets each of those rules stay a few lines over
them, and keeps a large run's thousands of pending groups cheap to search. The
numbering of groups lives here too, since it is the run's position in the seed
sequence that a checkpoint saves.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll_async.errors import LifecycleError
from roll_async.trajectory import Trajectory


@dataclass(eq=False)
class EpisodeGroup:
    """One episode specification (tag, env config, seed) and its seats: the played, the in-flight, the free."""

    group_id: int
    tag: str
    tag_index: int
    seed: int
    created_step: int
    num_seats: int
    needed: int
    env_config_override: dict[str, Any] | None = None
    #: Batches served before this group was created (a group served later than the next batch was carried over).
    created_batch: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)
    in_flight: dict[int, int] = field(default_factory=dict)  # episode_id -> env_id
    next_episode_id: int = 0
    env_errors: int = 0
    complete: bool = False
    #: In the tag's list of groups that may have a free seat (PendingGroups.open).
    listed_open: bool = False

    def free_seats(self) -> int:
        if self.complete:
            return 0
        return self.num_seats - len(self.trajectories) - len(self.in_flight)


class PendingGroups:
    """Per tag, the groups created and not yet served or dropped, and how groups are numbered.

    ``by_tag[tag]`` is ordered by group_id (so by created_step too). ``open[tag]`` lists, oldest first, the
    pending groups that may have a free seat; full ones are dropped from it lazily, so finding a seat does
    not rescan every pending group (a large run keeps thousands pending).
    """

    def __init__(self, tags: Sequence[str]) -> None:
        self.by_tag: dict[str, list[EpisodeGroup]] = {tag: [] for tag in tags}
        self.open: dict[str, deque[EpisodeGroup]] = {tag: deque() for tag in tags}
        self.by_id: dict[int, EpisodeGroup] = {}
        #: The position in the seed sequence (seed_state): the next group_id, groups made per tag.
        self.next_group_id = 0
        self.created_per_tag = {tag: 0 for tag in tags}

    def __iter__(self) -> Iterator[EpisodeGroup]:
        for groups in self.by_tag.values():
            yield from groups

    def is_pending(self, group: EpisodeGroup) -> bool:
        return self.by_id.get(group.group_id) is group

    def add(self, group: EpisodeGroup) -> None:
        self.next_group_id = group.group_id + 1
        self.created_per_tag[group.tag] += 1
        self.by_tag[group.tag].append(group)
        self.by_id[group.group_id] = group
        self.list_open(group)

    def remove(self, group: EpisodeGroup) -> int | None:
        """Take ``group`` out in O(log n) (bisect by group_id); its former index in ``by_tag``, if it was there."""
        pending = self.by_tag[group.tag]
        index = bisect.bisect_left(pending, group.group_id, key=lambda g: g.group_id)
        found = index < len(pending) and pending[index] is group
        if found:
            del pending[index]
        self.by_id.pop(group.group_id, None)
        return index if found else None

    def oldest_with_free_seat(self, tag: str) -> EpisodeGroup | None:
        open_groups = self.open[tag]
        while open_groups:
            group = open_groups[0]
            if group.free_seats() > 0 and self.is_pending(group):
                return group
            open_groups.popleft()  # full, complete or gone; re-listed if a seat re-opens
            group.listed_open = False
        return None

    def list_open(self, group: EpisodeGroup) -> None:
        """Put a pending group back in its tag's open list after a seat re-opened (error, abort, cancel)."""
        if group.listed_open or group.free_seats() <= 0 or not self.is_pending(group):
            return
        group.listed_open = True
        open_groups = self.open[group.tag]
        if not open_groups or open_groups[-1].group_id < group.group_id:
            open_groups.append(group)
        else:
            ordered = list(open_groups)
            bisect.insort(ordered, group, key=lambda g: g.group_id)
            self.open[group.tag] = deque(ordered)

    def seed_state(self) -> dict[str, Any]:
        """The position in the seed sequence: the next group_id and the groups made per tag."""
        return {
            "next_group_id": self.next_group_id,
            "tag_group_count": dict(self.created_per_tag),
        }

    def load_seed_state(self, state: Mapping[str, Any]) -> None:
        """Continue the seed sequence at ``state`` (what ``seed_state`` returned); only before any group exists."""
        if self.by_id:
            raise LifecycleError(
                "load_seed_state must run before the first group is created"
            )
        self.next_group_id = int(state["next_group_id"])
        created = self.created_per_tag
        for tag, count in dict(state["tag_group_count"]).items():
            if tag in created:
                created[tag] = int(count)

    def describe(self) -> dict[str, list[dict[str, Any]]]:
        """Per tag, each pending group's id, seed, step, progress and seats in flight (for debugging and tests)."""
        return {
            tag: [
                {
                    "group_id": g.group_id,
                    "seed": g.seed,
                    "created_step": g.created_step,
                    "done": len(g.trajectories),
                    "in_flight": dict(g.in_flight),
                    "complete": g.complete,
                }
                for g in groups
            ]
            for tag, groups in self.by_tag.items()
        }
