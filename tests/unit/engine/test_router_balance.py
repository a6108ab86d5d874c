"""Router: per-episode binding released at episode end, global load from the replicas, rebalance, failover.

Fake engines in process (scheduling logic only); the real two-replica failover is
tests/integration/test_replica_failover.py.
"""

from __future__ import annotations

import asyncio

import pytest

from roll_async.engine.router import Router
from roll_async.errors import NoLiveReplicaError, ReplicaDeadError
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import GenerationRequest


def request(request_id: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt_token_ids=[1, 2, 3], max_tokens=4
    )


class LoadedReplica(FakeEngine):
    """A fake replica that reports ``other_workers`` extra requests in flight (other workers' load)."""

    def __init__(self, other_workers: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.other_workers = other_workers

    async def stats(self) -> dict:
        stats = await super().stats()
        stats["in_flight"] += self.other_workers
        return stats


class DyingReplica(FakeEngine):
    """Raises ReplicaDeadError (what RayEngineClient raises for a dead actor) once ``dead`` is set."""

    dead = False

    async def generate(self, request):
        if self.dead:
            raise ReplicaDeadError("actor died")
        return await super().generate(request)


async def test_binding_is_released_when_the_episode_ends_and_the_next_episode_picks_again():
    replicas = [FakeEngine(), FakeEngine()]
    router = Router(replicas, load_poll_s=0)
    client = router.client_for("env")
    await client.generate(request("e1-t0"))
    first = router.replica_for("env")
    assert router.stats()["replicas"][first]["bound_episodes"] == 1
    client.end_episode()
    assert [r["bound_episodes"] for r in router.stats()["replicas"]] == [0, 0]
    # The other replica now has fewer bound episodes: after a release the next episode may go elsewhere.
    router.replica_for("other")
    assert router.replica_for("env") != router.replica_for("other")


async def test_new_episodes_go_to_the_replica_with_the_lowest_global_count():
    # Replica 0 carries 10 requests of other workers; this router has sent nothing yet.
    replicas = [LoadedReplica(other_workers=10), LoadedReplica(other_workers=0)]
    router = Router(replicas, load_poll_s=0.01, rotation_offset=0)
    await router.generate(request("warm"), env_key="w")  # starts the first poll
    for _ in range(100):
        if router.polls:
            break
        await asyncio.sleep(0.01)
    assert router.global_load() == [10, 0]
    assert router.replica_for("new-episode") == 1


async def test_an_episode_on_an_overloaded_replica_is_rebalanced():
    replicas = [LoadedReplica(other_workers=0), LoadedReplica(other_workers=0)]
    router = Router(
        replicas, load_poll_s=0.01, rebalance_ratio=2.0, rebalance_min_gap=4
    )
    await router.generate(request("t0"), env_key="ep")
    home = router.replica_for("ep")
    replicas[home].other_workers = 20  # other workers pile onto this replica
    await asyncio.sleep(0.02)
    await router.generate(request("warm"), env_key="poller")  # triggers a poll
    for _ in range(100):
        if router.global_load()[home] >= 20:
            break
        await asyncio.sleep(0.01)
    await router.generate(request("t1"), env_key="ep")
    assert router.replica_for("ep") == 1 - home
    assert router.stats()["replicas"][home]["rebalanced_away"] == 1


async def test_no_rebalance_while_the_loads_are_close():
    replicas = [LoadedReplica(other_workers=3), LoadedReplica(other_workers=0)]
    router = Router(
        replicas,
        load_poll_s=0.01,
        rebalance_ratio=2.0,
        rebalance_min_gap=4,
        rotation_offset=0,
    )
    router._bind("ep", 0)
    await router.generate(request("warm"), env_key="x")
    await asyncio.sleep(0.05)
    await router.generate(request("t1"), env_key="ep")
    # 3 vs 0 is below the minimum gap of 4: keep the prefix cache
    assert router.replica_for("ep") == 0


async def test_a_dead_replica_fails_over_to_the_survivor_without_an_error():
    replicas = [DyingReplica(), DyingReplica()]
    router = Router(replicas, load_poll_s=0)
    await router.generate(request("a0"), env_key="a")
    await router.generate(request("b0"), env_key="b")
    dead = router.replica_for("a")
    replicas[dead].dead = True
    result = await router.generate(
        request("a1"), env_key="a"
    )  # re-sent to the survivor
    assert result.finish_reason in ("length", "stop")
    assert router.replica_for("a") == 1 - dead
    stats = router.stats()["replicas"]
    assert stats[dead]["dead"] and stats[dead]["failed_over"] >= 1
    for i in range(5):  # new episodes never go to the dead replica
        assert router.replica_for(f"new{i}") == 1 - dead
    await router.abort(["a1"])  # aborts skip the dead replica


async def test_when_every_replica_is_dead_generate_raises():
    replicas = [DyingReplica(), DyingReplica()]
    router = Router(replicas, load_poll_s=0)
    replicas[0].dead = replicas[1].dead = True
    with pytest.raises(NoLiveReplicaError, match="all 2 engine replicas died"):
        await router.generate(request("x"), env_key="x")


class CountingReplica(FakeEngine):
    stats_calls = 0

    async def stats(self) -> dict:
        self.stats_calls += 1
        return await super().stats()


@pytest.mark.parametrize("num_replicas", [1, 2])
async def test_load_is_polled_only_when_there_is_a_replica_to_choose(num_replicas):
    """With one live replica a poll would be remote calls for no routing decision."""
    replicas = [CountingReplica() for _ in range(num_replicas)]
    router = Router(replicas, load_poll_s=0.001)
    for turn in range(5):
        await router.generate(request(f"r{turn}"), env_key=turn)
        await asyncio.sleep(0.005)
    calls = sum(r.stats_calls for r in replicas)
    if num_replicas == 1:
        assert router.polls == 0 and calls == 0
    else:
        assert router.polls > 0 and calls > 0
