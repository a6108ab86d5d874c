"""Group filters, chosen by name in config (``<env_manager>.group_filter``).

A filter sees one complete group (``group_size`` trajectories of the same env
config and seed) and returns True to KEEP it; a dropped group is counted
(``rollout/filtered_groups``) and replaced, so batches stay whole, kept groups.
The names here must equal the config's ``GroupFilterName`` choices (a unit test
holds the two lists together).
"""

from __future__ import annotations

from collections.abc import Callable

from roll_async.errors import ConfigError
from roll_async.trajectory import Trajectory

GroupFilter = Callable[[list[Trajectory]], bool]

#: Rewards closer than this count as equal.
REWARD_TOLERANCE = 1e-6


def keep_all(group: list[Trajectory]) -> bool:
    """No filtering."""
    return True


def keep_if_reward_varies(group: list[Trajectory]) -> bool:
    """Drop groups whose episode rewards are all equal: GRPO-style advantages are zero there."""
    rewards = [t.episode_reward for t in group]
    return bool(rewards) and (max(rewards) - min(rewards)) > REWARD_TOLERANCE


#: name -> predicate (True keeps the group). Names are what config files use.
GROUP_FILTERS: dict[str, GroupFilter] = {
    "none": keep_all,
    "zero_variance": keep_if_reward_varies,
}


def resolve_group_filter(name_or_fn: str | GroupFilter) -> GroupFilter:
    """A filter by config name, or a callable passed through (tests, custom pipelines)."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return GROUP_FILTERS[name_or_fn]
    except KeyError:
        raise ConfigError(
            f"group_filter={name_or_fn!r} is unknown; choose one of: {', '.join(GROUP_FILTERS)}"
        ) from None
