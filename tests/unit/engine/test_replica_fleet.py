"""Weight syncs go on when an engine replica dies: fake actor handles (no Ray runtime) that raise Ray's death errors."""

from __future__ import annotations

import logging

import pytest
from ray.exceptions import ActorDiedError, RayActorError

from roll_async.engine.replica_fleet import EngineReplicaFleet
from roll_async.errors import NoLiveReplicaError


class _Method:
    def __init__(self, handle: FakeEngineHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args):
        async def call():
            self.handle.calls.append(self.name)
            if self.name in self.handle.dies_at:
                self.handle.alive = False
            if not self.handle.alive:
                raise self.handle.death
            return self.handle.apply(self.name, *args)

        return call()


class FakeEngineHandle:
    """A stand-in for an engine actor handle: ``h.pause.remote(mode)`` etc.; dies at the named call."""

    def __init__(
        self, dies_at: tuple[str, ...] = (), death: BaseException | None = None
    ) -> None:
        self.dies_at = dies_at
        self.death = death or RayActorError()
        self.alive = True
        self.paused = False
        self.version = 0
        self.calls: list[str] = []

    def apply(self, name: str, *args):
        if name == "pause":
            self.paused = True
        elif name == "resume":
            self.paused = False
        elif name in ("update_weights", "advance_weight_version"):
            self.version = args[-1]
        elif name == "get_weight_version":
            return self.version
        return None

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


@pytest.mark.parametrize("stage", ["pause", "update_weights", "resume"])
async def test_a_replica_that_dies_at_any_stage_is_dropped_and_the_survivor_is_updated_and_resumed(
    stage, caplog
):
    survivor, victim = (
        FakeEngineHandle(),
        FakeEngineHandle(dies_at=(stage,), death=ActorDiedError()),
    )
    fleet = EngineReplicaFleet([survivor, victim])
    assert fleet.metrics() == {"engine/live_replicas": 2.0}
    with caplog.at_level(logging.ERROR):
        updated = await fleet.push_weights(["bucket-ref"], version=3, in_flight="abort")
    assert survivor.version == 3 and not survivor.paused
    assert survivor.calls == ["pause", "update_weights", "resume"]
    assert updated == (
        [0] if stage != "resume" else [0, 1]
    )  # a death at resume comes after the update
    assert fleet.live_indices == [0] and fleet.metrics() == {
        "engine/live_replicas": 1.0
    }
    assert "engine replica 1 is dead (ActorDiedError" in caplog.text
    # The next sync does not touch the dead replica again.
    await fleet.push_simulated_version(4, "wait", sync_s=0.0)
    assert (
        survivor.version == 4
        and not survivor.paused
        and await fleet.weight_version() == 4
    )
    assert victim.calls.count("pause") == 1


async def test_when_no_replica_is_left_the_sync_raises_a_clear_error():
    first, second = (
        FakeEngineHandle(dies_at=("pause",)),
        FakeEngineHandle(dies_at=("update_weights",)),
    )
    fleet = EngineReplicaFleet([first, second])
    expected = r"every engine replica died \(weight sync to version 1\).*replica 0: RayActorError"
    with pytest.raises(NoLiveReplicaError, match=expected):
        await fleet.push_weights([], version=1, in_flight="abort")
    assert fleet.metrics() == {"engine/live_replicas": 0.0}
    with pytest.raises(NoLiveReplicaError):
        await fleet.weight_version()


async def test_an_error_that_is_not_a_death_is_raised_after_every_replica_is_resumed():
    class BadWeights(FakeEngineHandle):
        def apply(self, name, *args):
            if name == "update_weights":
                raise KeyError("model.layers.0.bogus")
            return super().apply(name, *args)

    good, bad = FakeEngineHandle(), BadWeights()
    fleet = EngineReplicaFleet([good, bad])
    with pytest.raises(KeyError, match="bogus"):
        await fleet.push_weights([], version=2, in_flight="abort")
    assert not good.paused and not bad.paused and fleet.live_indices == [0, 1]
