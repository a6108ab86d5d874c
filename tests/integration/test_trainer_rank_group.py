"""TrainerRankGroup._each on small Ray actors: silent ranks past trainer.rank_call_timeout_s stop the group.

A rank hung outside a collective (a deadlock, a stuck filesystem) is bounded by no
torch.distributed timeout, so without the deadline the run would wait forever. The
ranks here are tiny actors (no torch.distributed), each told to answer, sleep or raise.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from roll_async.errors import TrainerRankTimeoutError
from roll_async.trainer.ranks.rank_group import TrainerRankGroup

# real Ray: a session instance and one worker process per actor
pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEADLINE_S = 1.5
#: How long a call may take before the test gives up on it (it would otherwise hang the test run).
GUARD_S = 30.0


def start_group(ray, behaviours: list[str]) -> TrainerRankGroup:
    """One FakeRank actor per behaviour (rank = position), behind a group with a DEADLINE_S deadline."""

    # Defined here so that Ray pickles it by value (a test module is not importable on Ray's workers).
    class FakeRank:
        """Stands in for a TrainerRank: each call answers, sleeps far past any deadline, or raises."""

        def __init__(self, rank: int, behaviour: str) -> None:
            self.rank = rank
            self.behaviour = behaviour

        def _act(self) -> None:
            if self.behaviour == "sleep":
                time.sleep(600)
            elif self.behaviour == "raise":
                raise ValueError(f"rank {self.rank} failed")

        def train_step(self, batch: Any, step: int) -> dict[str, float]:
            self._act()
            return {
                "rank": float(self.rank),
                "step": float(step),
                "rows": float(len(batch)),
            }

        def memory(self) -> dict[str, int]:
            self._act()
            return {"rank": self.rank}

        def ping(self) -> int:
            return self.rank

    actors = [
        ray.remote(FakeRank).options(num_cpus=0, max_restarts=0).remote(rank, kind)
        for rank, kind in enumerate(behaviours)
    ]
    ray.get([actor.ping.remote() for actor in actors], timeout=GUARD_S)
    return TrainerRankGroup(actors, None, [], call_timeout_s=DEADLINE_S)


def call_guarded(
    ray, group: TrainerRankGroup, method: str, *args: Any
) -> tuple[Any, float]:
    """``(result or raised error, seconds)`` of ``group.<method>(*args)``; fails the test if it is still waiting after GUARD_S."""
    actors = list(group.actors)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = getattr(group, method)(*args)
        except BaseException as exc:
            outcome["value"] = exc

    thread = threading.Thread(target=call, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(GUARD_S)
    elapsed = time.monotonic() - started
    if thread.is_alive():
        for actor in actors:  # lets the stuck wait end
            ray.kill(actor)
        pytest.fail(
            f"group.{method} still waiting on its ranks after {GUARD_S:g} s: the call has no deadline"
        )
    return outcome["value"], elapsed


def assert_killed(ray, actors: list[Any], within_s: float = 60.0) -> None:
    """Each actor stops answering: ``ray.kill`` is asynchronous, so on a loaded machine a ping sent just
    after it can still be served; the actor must be gone within ``within_s``."""
    deadline = time.monotonic() + within_s
    for actor in actors:
        while True:
            try:
                ray.get(actor.ping.remote(), timeout=GUARD_S)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, (
                f"{actor} still answers {within_s} s after the group stopped it"
            )
            time.sleep(0.2)


def test_ranks_silent_past_the_deadline_stop_the_group_and_are_named(ray_session):
    ray = ray_session
    group = start_group(ray, ["sleep", "sleep"])
    actors = list(group.actors)
    error, elapsed = call_guarded(ray, group, "train_step", [1, 2, 3], 7)

    assert isinstance(error, TrainerRankTimeoutError), error
    message = str(error)
    assert "train_step" in message and "[0, 1]" in message
    assert "trainer.rank_call_timeout_s" in message and "\n" not in message
    assert error.method == "train_step" and error.ranks == [0, 1]
    # Ray's wait rounds its timeout to milliseconds
    assert DEADLINE_S - 0.05 <= error.waited_s <= elapsed < DEADLINE_S + 10
    assert group.actors == []
    assert_killed(ray, actors)


def test_a_rank_error_wins_over_the_deadline(ray_session):
    ray = ray_session
    group = start_group(ray, ["sleep", "raise"])
    actors = list(group.actors)
    error, _ = call_guarded(ray, group, "train_step", [1], 0)

    assert isinstance(error, ValueError) and "rank 1 failed" in str(error), error
    assert group.actors == []
    assert_killed(ray, actors)


def test_answers_come_back_in_rank_order(ray_session):
    ray = ray_session
    group = start_group(ray, ["answer", "answer", "answer"])
    try:
        memory, _ = call_guarded(ray, group, "memory")
        assert memory == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
        metrics, _ = call_guarded(ray, group, "train_step", [1, 2], 4)
        assert metrics == {"rank": 0.0, "step": 4.0, "rows": 2.0}  # the main rank's
    finally:
        group.shutdown()
