"""Elo-style ratings of the policy against its own snapshots: is the policy getting better than its past?

Win rates against a pool move with the pool: as the snapshots improve, the policy's win rate against
them can stay flat while it improves. A rating carried across weight versions answers the question the
win rate cannot. Each weight version of the policy has a rating; a new version starts at the rating of
the newest version before it; every finished game of a policy seat against a snapshot (``snapshot:<k>``
or ``pool``) updates the version that played and the snapshot's version (the played version minus
``k``) by the Elo rule; a game against the current policy itself (``k`` 0) rates nothing. The driver's scheduler keeps one instance for the run; checkpoints carry its
:meth:`PoolRatings.state`, so a resumed run goes on rating from where it stopped.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from roll_async.metrics import game_rating_metric
from roll_async.trajectory import Trajectory

#: The trained seat's metric naming a snapshot opponent's lag: ``game_snapshot_lag_seat<N>``.
SNAPSHOT_LAG = re.compile(r"game_snapshot_lag_seat\d+")
#: Score of a finished game for the policy seat, from its outcome metrics.
_SCORES = {"game_win": 1.0, "game_draw": 0.5, "game_loss": 0.0}


def expected_score(rating: float, opponent: float) -> float:
    """Elo's expected score of a player rated ``rating`` against one rated ``opponent``."""
    return 1.0 / (1.0 + float(10.0 ** ((opponent - rating) / 400.0)))


@dataclass
class SnapshotRatings:
    """Ratings per weight version of one tag's policy, updated from its games against its snapshots."""

    k_factor: float = 16.0
    initial: float = 1000.0
    ratings: dict[int, float] = field(default_factory=dict)

    def rating(self, version: int) -> float:
        """The version's rating; a version not rated yet has the newest earlier version's (else ``initial``)."""
        if version in self.ratings:
            return self.ratings[version]
        known = sorted(self.ratings)
        index = bisect_right(known, version)
        return self.ratings[known[index - 1]] if index else self.initial

    def play(self, version: int, opponent_version: int, score: float) -> None:
        """Record one game: the policy at ``version`` scored ``score`` against itself at ``opponent_version``."""
        mine, theirs = self.rating(version), self.rating(opponent_version)
        delta = self.k_factor * (score - expected_score(mine, theirs))
        self.ratings[version] = mine + delta
        self.ratings[opponent_version] = theirs - delta


@dataclass
class PoolRatings:
    """One :class:`SnapshotRatings` per game tag; :meth:`update` turns a served batch into metrics."""

    by_tag: dict[str, SnapshotRatings] = field(default_factory=dict)

    def state(self) -> dict[str, dict[str, Any]]:
        """The ratings as JSON-safe data, for a checkpoint (versions as strings)."""
        return {
            tag: {
                "k_factor": r.k_factor,
                "initial": r.initial,
                "ratings": {str(v): rating for v, rating in sorted(r.ratings.items())},
            }
            for tag, r in self.by_tag.items()
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> PoolRatings:
        """The ratings :meth:`state` saved (none: a fresh instance, as for a checkpoint that predates them)."""
        return cls(
            {
                tag: SnapshotRatings(
                    k_factor=float(saved["k_factor"]),
                    initial=float(saved["initial"]),
                    ratings={int(v): float(r) for v, r in saved["ratings"].items()},
                )
                for tag, saved in (state or {}).items()
            }
        )

    def update(self, trajectories: Iterable[Trajectory]) -> dict[str, float]:
        """Rate the batch's finished games against snapshots; ``game/<tag>/policy_elo`` and its pool's mean."""
        newest: dict[str, int] = {}
        faced: dict[str, list[int]] = {}
        for t in trajectories:
            score = next((s for key, s in _SCORES.items() if t.metrics.get(key)), None)
            lags = [int(v) for k, v in t.metrics.items() if SNAPSHOT_LAG.fullmatch(k)]
            version = t.newest_weight_version
            if not t.role or score is None or len(lags) != 1 or version is None:
                continue  # not a finished two-seat game against one snapshot
            if lags[0] == 0:
                continue  # the current policy against itself (pool.include_current) rates nothing
            opponent = version - lags[0]
            ratings = self.by_tag.setdefault(t.tag, SnapshotRatings())
            ratings.play(version, opponent, score)
            newest[t.tag] = max(newest.get(t.tag, version), version)
            faced.setdefault(t.tag, []).append(opponent)
        out: dict[str, float] = {}
        for tag, version in newest.items():
            ratings = self.by_tag[tag]
            opponents = sorted(set(faced[tag]))
            pool = sum(ratings.rating(v) for v in opponents) / len(opponents)
            out[game_rating_metric(tag, "policy_elo")] = ratings.rating(version)
            out[game_rating_metric(tag, "pool_elo")] = pool
            out[game_rating_metric(tag, "elo_games")] = float(len(faced[tag]))
        return out
