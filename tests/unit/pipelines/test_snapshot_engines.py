"""SnapshotWeights: after each push to the policy, the lag-k snapshot engine gets the push k syncs back.

Fake engine actor handles (``h.pause.remote(...)`` etc., no Ray runtime) record the weight
buckets and version each ``update_weights`` loaded, so a test reads what each lag's engine holds.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.exceptions import RayActorError

from roll_async.pipelines.snapshot_engines import SnapshotWeights


class _Method:
    def __init__(self, handle: RecordingHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            if self.handle.dead:
                raise RayActorError()
            self.handle.calls.append(self.name)
            if self.name == "update_weights":
                self.handle.loads.append((args[1], args[0]))
            return None

        return call()


class RecordingHandle:
    """A stand-in engine actor handle: records each load as (version, buckets) and every call's name."""

    def __init__(self) -> None:
        self.loads: list[tuple[int, Any]] = []
        self.calls: list[str] = []
        self.dead = False

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


def bucket(version: int) -> list[str]:
    return [f"weights-of-v{version}"]


async def test_each_lag_gets_the_version_k_syncs_back_once_it_exists_and_keeps_its_start_weights_until_then():
    lag1, lag2 = RecordingHandle(), RecordingHandle()
    weights = SnapshotWeights({1: [lag1], 2: [lag2]})
    await weights.push(
        bucket(1), 1
    )  # both still hold the model path's weights: version 0
    assert lag1.loads == [] and lag2.loads == []
    await weights.push(bucket(2), 2)
    assert lag1.loads == [(1, bucket(1))] and lag2.loads == []
    await weights.push(bucket(3), 3)
    await weights.push(bucket(4), 4)
    assert lag1.loads == [(1, bucket(1)), (2, bucket(2)), (3, bucket(3))]
    assert lag2.loads == [(1, bucket(1)), (2, bucket(2))]
    # a load waits for the snapshot's requests in flight: pause, update, resume
    assert lag2.calls == ["pause", "update_weights", "resume"] * 2
    # only what a later push can need is kept: the last max-k pushes
    assert [version for version, _ in weights.kept] == [3, 4]


async def test_the_start_weights_go_to_every_engine_and_stay_the_oldest_version_there_is():
    lag1, lag2 = RecordingHandle(), RecordingHandle()
    weights = SnapshotWeights({1: [lag1], 2: [lag2]})
    await weights.load_start(bucket(5), 5)  # a resume at step 5 (or a warm start)
    assert lag1.loads == lag2.loads == [(5, bucket(5))]
    await weights.push(
        bucket(6), 6
    )  # lag 1 holds 5 already; lag 2 has no version 4 to play
    await weights.push(bucket(7), 7)
    assert lag1.loads == [(5, bucket(5)), (6, bucket(6))]
    assert lag2.loads == [(5, bucket(5))]
    await weights.push(bucket(8), 8)
    assert lag2.loads == [(5, bucket(5)), (6, bucket(6))]


async def test_a_sync_interval_spaces_the_versions_and_a_lag_counts_syncs():
    lag1 = RecordingHandle()
    weights = SnapshotWeights({1: [lag1]})
    for version in (2, 4, 6):  # weight_sync.interval 2
        await weights.push(bucket(version), version)
    assert lag1.loads == [(2, bucket(2)), (4, bucket(4))]


async def test_a_dead_snapshot_engine_is_logged_and_left_out_the_others_go_on(caplog):
    lag1, lag2 = RecordingHandle(), RecordingHandle()
    weights = SnapshotWeights({1: [lag1], 2: [lag2]})
    await weights.push(bucket(1), 1)
    lag1.dead = True
    with caplog.at_level(logging.ERROR):
        await weights.push(bucket(2), 2)
    assert "the engine of policy snapshot 1 is dead" in caplog.text
    await weights.push(bucket(3), 3)
    assert lag1.loads == [] and lag2.loads == [(1, bucket(1))]
    assert list(weights.fleets) == [2]
