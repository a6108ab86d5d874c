"""What an EnvManager tells its host about itself: the phase its episode is in (read
by the watchdog) and its counters (reported with the worker's stats). The episode
loop, turn generation, env calls and agent episodes all write here, so these
records live apart from each of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from roll_async.trajectory import EpisodeSpec

EnvPhase = Literal[
    "idle",
    "waiting_for_episode",
    "build_env",
    "reset",
    "generate",
    "env_step",
    "reward",
    "handing_over",
    "stopped",
]

#: Every phase an episode can stall in, so the watchdog reports a stay longer than its timeout in any of them.
#: ``waiting_for_episode`` covers a seat request or hand-over whose answer never comes back (lost in transport);
#: a long wait the queue itself holds (quota, sync suspension) is told apart by the queue (report_stalled).
STALL_PHASES: tuple[EnvPhase, ...] = (
    "waiting_for_episode",
    "build_env",
    "reset",
    "generate",
    "env_step",
    "reward",
    "handing_over",
)


@dataclass
class EnvProgress:
    """What the env is doing, for the watchdog."""

    phase: EnvPhase = "idle"
    last_progress_at: float = 0.0
    group_id: int | None = None
    episode_id: int | None = None
    turn: int | None = None

    @property
    def can_stall(self) -> bool:
        """In a phase that should end (every phase but idle and stopped; see STALL_PHASES)."""
        return self.phase in STALL_PHASES


@dataclass
class EnvManagerStats:
    episodes: int = 0
    env_errors: int = 0
    env_timeouts: int = 0
    env_builds: int = 0
    cancelled_episodes: int = 0
    #: Of those, cancels that arrived before their seat: the episode ended as it started, unplayed.
    cancelled_before_start: int = 0
    resumed_generations: int = 0
    engine_retries: int = 0
    #: CPU seconds the env's own sync calls used (their threads'), so benchmarks can tell env work from ours.
    env_cpu_s: float = 0.0


class PhaseReporter:
    """Holds the current episode's :class:`EnvProgress`; each part that plays the episode reports its phase here."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: The episode being played (None between episodes); its ids go into every report.
        self.episode: EpisodeSpec | None = None
        self.progress = EnvProgress(last_progress_at=clock())

    def set_phase(self, phase: EnvPhase, turn: int | None = None) -> None:
        episode = self.episode
        self.progress = EnvProgress(
            phase=phase,
            last_progress_at=self._clock(),
            group_id=episode.group_id if episode else None,
            episode_id=episode.episode_id if episode else None,
            turn=turn,
        )
