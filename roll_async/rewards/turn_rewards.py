"""The per-turn scoring calls of one episode (``custom_envs.<Tag>.reward.per_turn``), run beside the env loop.

A judge call takes far longer than an env step, so a turn's call starts as
soon as its env step ends and runs while the episode goes on (the client's
semaphore, timeout and retries bound it as any call); the EnvManager awaits
them all only before the hand-over, and cancels them when the episode is
cancelled or fails. How the scores enter the rewards is the scorer's
(``EpisodeRewardScorer.apply_turns``).
"""

from __future__ import annotations

import asyncio
import time

from roll_async.rewards.episode_text import EpisodeText
from roll_async.rewards.scorer import EpisodeRewardScorer, RewardOutcome, TurnScore
from roll_async.trajectory import Trajectory


class TurnRewards:
    """One episode's turn scorings: :meth:`start` per stepped turn, :meth:`apply` once, :meth:`cancel` on the way out."""

    def __init__(self, scorer: EpisodeRewardScorer, name: str = "") -> None:
        self.scorer = scorer
        self.name = name
        self._tasks: list[asyncio.Task[TurnScore]] = []

    @property
    def pending(self) -> int:
        """Calls started and not finished yet."""
        return sum(not task.done() for task in self._tasks)

    def start(self, turn: int, text: EpisodeText) -> None:
        """Start scoring turn ``turn`` (its reply and the question it answered) in the background."""
        self._tasks.append(
            asyncio.create_task(
                self._score(turn, text), name=f"{self.name}-reward-t{turn}"
            )
        )

    async def _score(self, turn: int, text: EpisodeText) -> TurnScore:
        started = time.time()
        result = await self.scorer.client.score(text)  # never raises but CancelledError
        return TurnScore(
            turn=turn, score=result, started_at=started, finished_at=time.time()
        )

    async def apply(self, trajectory: Trajectory) -> RewardOutcome:
        """Wait for every started call, then write the turn and episode rewards into ``trajectory``."""
        scores = await asyncio.gather(*self._tasks)
        self._tasks = []
        return self.scorer.apply_turns(trajectory, scores)

    def cancel(self) -> None:
        """Cancel the calls still running (a cancelled judge call aborts its engine request)."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
