"""The rollout window a served batch stands for, and how much of it the envs spent waiting for a seat.

Each batch reports ``env_busy_fraction``: the share of env seconds since the
previous batch that were not spent waiting for a seat. Measuring it needs the
window's start and, per env, when its current wait began; this small clock
keeps both out of the queue's seat and serving rules.
"""

from __future__ import annotations

from collections.abc import Callable


class BusyWindow:
    """The rollout window a batch stands for, and the env seconds spent waiting for a seat in it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.start = clock()
        #: env_id -> when it began waiting for a seat.
        self._idle_since: dict[int, float] = {}
        #: Idle env seconds of waits that ended in this window.
        self._idle_s = 0.0

    def env_waits(self, env_id: int) -> None:
        if env_id not in self._idle_since:
            self._idle_since[env_id] = self._clock()

    def is_waiting(self, env_id: int) -> bool:
        """The env is inside next_episode, waiting for a seat."""
        return env_id in self._idle_since

    def env_stops_waiting(self, env_id: int) -> None:
        since = self._idle_since.pop(env_id, None)
        if since is not None:
            self._idle_s += max(0.0, self._clock() - max(since, self.start))

    def restart(self) -> None:
        self.start = self._clock()
        self._idle_s = 0.0

    def close(self, now: float, num_envs: int) -> tuple[float, float]:
        """End the window at ``now``: (its seconds, the share of env seconds not spent waiting for a seat)."""
        window = now - self.start
        idle_s = self._idle_s + sum(
            now - max(since, self.start) for since in self._idle_since.values()
        )
        env_seconds = num_envs * window
        self.start = now
        self._idle_s = 0.0
        busy = max(0.0, 1.0 - idle_s / env_seconds) if env_seconds > 0 else 0.0
        return window, busy
