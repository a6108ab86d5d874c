"""Router: sticky envs, least-loaded placement of new envs, aborts reach the right replica."""

from __future__ import annotations

import asyncio

from roll_async.engine.router import Router
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import GenerationRequest


def request(request_id: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt_token_ids=[1, 2, 3], max_tokens=4
    )


async def test_an_env_sticks_to_its_replica():
    replicas = [FakeEngine(), FakeEngine()]
    router = Router(replicas)
    for i in range(3):
        await router.generate(request(f"a{i}"), env_key="env-a")
    assert [len(r.requests) for r in replicas].count(3) == 1


async def test_new_envs_go_to_the_least_loaded_replica():
    replicas = [
        FakeEngine(latency_s=0.2),
        FakeEngine(latency_s=0.2),
        FakeEngine(latency_s=0.2),
    ]
    router = Router(replicas)
    busy = asyncio.create_task(router.generate(request("x"), env_key="env-x"))
    await asyncio.sleep(0.01)
    first = router.replica_for("env-x")
    others = {router.replica_for("env-y"), router.replica_for("env-z")}
    assert first not in others and len(others) == 2
    assert router.load()[first] == 1
    await busy
    assert router.load() == [0, 0, 0]


async def test_rotation_offset_spreads_first_envs_of_different_routers():
    replicas = [FakeEngine(), FakeEngine()]
    assert Router(replicas, rotation_offset=0).replica_for("e") == 0
    assert Router(replicas, rotation_offset=1).replica_for("e") == 1


async def test_abort_reaches_the_replica_running_the_request():
    replicas = [FakeEngine(token_latency_s=0.05), FakeEngine(token_latency_s=0.05)]
    router = Router(replicas)
    router.replica_for("a")
    router.replica_for("b")
    running = asyncio.create_task(router.generate(request("req-b"), env_key="b"))
    await asyncio.sleep(0.02)
    await router.abort(["req-b"])
    result = await running
    assert result.finish_reason == "abort"
    assert replicas[router.replica_for("b")].aborted_request_ids == ["req-b"]


async def test_abort_of_an_untracked_request_goes_to_the_env_replica_or_everywhere():
    calls: list[tuple[int, list[str]]] = []

    class Replica(FakeEngine):
        def __init__(self, index):
            super().__init__()
            self.index = index

        async def abort(self, request_ids):
            calls.append((self.index, list(request_ids)))

    router = Router([Replica(0), Replica(1)])
    replica = router.replica_for("env")
    await router.client_for("env").abort(["gone-1"])
    assert calls == [(replica, ["gone-1"])]
    calls.clear()
    await router.abort(["gone-2"])
    assert sorted(calls) == [(0, ["gone-2"]), (1, ["gone-2"])]


async def test_client_for_binds_an_env():
    replicas = [FakeEngine(), FakeEngine()]
    router = Router(replicas)
    client = router.client_for(7)
    result = await client.generate(request("r"))
    assert result.output_token_ids == [5, 5, 5, 5]
    assert len(replicas[router.replica_for(7)].requests) == 1
    router.forget(7)
    assert router.load() == [0, 0]
