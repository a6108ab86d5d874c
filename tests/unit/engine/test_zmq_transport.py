"""Engine requests over ZMQ (roll_async/engine/zmq_engine_client.py on roll_async/runtime/zmq_calls.py), with a FakeEngine behind the socket.

No Ray here: the engine actor's handle is a local stand-in (tests/unit/local_actor.py) whose
``method.remote(...)`` calls the object, and whose liveness check raises Ray's actor-death error once
the test "kills" it.
"""

from __future__ import annotations

import asyncio

import pytest

from roll_async.engine.router import Router
from roll_async.engine.zmq_engine_client import ENGINE_METHODS, ZmqEngineClient
from roll_async.errors import ReplicaDeadError, ZmqConnectError
from roll_async.runtime.zmq_calls import CallEndpoint
from roll_async.testing.fake_engine import FakeEngine, FakeEngineError
from roll_async.trajectory import GenerationRequest
from tests.unit.local_actor import LocalActor


def request(i: int, max_tokens: int = 4) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"r{i}", prompt_token_ids=[1, 2, i], max_tokens=max_tokens
    )


@pytest.fixture
def clients():
    """Clients and handles a test made; their sockets are closed after it."""
    made: list[ZmqEngineClient | LocalActor] = []
    yield made
    for item in made:
        item.close()


@pytest.mark.parametrize(
    "client_node", ["node-a", "node-b"], ids=["ipc-same-node", "tcp-other-node"]
)
async def test_generate_round_trip_same_result_as_a_direct_call(clients, client_node):
    engine = FakeEngine(
        output_fn=lambda r: [7, 8, r.prompt_token_ids[-1]], latency_s=0.01
    )
    handle = LocalActor(engine, ENGINE_METHODS)
    client = ZmqEngineClient(handle, node_id=client_node)
    clients += [client, handle]
    results = await asyncio.gather(*(client.generate(request(i)) for i in range(50)))
    assert [r.request_id for r in results] == [f"r{i}" for i in range(50)]
    assert [r.output_token_ids for r in results] == [[7, 8, i] for i in range(50)]
    assert len(engine.requests) == 50 and handle.server.calls_served == 50
    assert handle.server.endpoint.address_for(client_node).startswith(
        "ipc://" if client_node == "node-a" else "tcp://"
    )


async def test_engine_error_surfaces_with_its_type_and_message(clients):
    handle = LocalActor(FakeEngine(fail_requests=1), ENGINE_METHODS)
    client = ZmqEngineClient(handle, node_id="node-a")
    clients += [client, handle]
    with pytest.raises(FakeEngineError):
        await client.generate(request(0))
    # the socket is still usable
    assert (await client.generate(request(1))).output_token_ids


async def test_cancelled_call_cancels_the_engine_request(clients):
    engine = FakeEngine(latency_s=30.0)
    handle = LocalActor(engine, ENGINE_METHODS)
    client = ZmqEngineClient(handle, node_id="node-a")
    clients += [client, handle]
    task = asyncio.create_task(client.generate(request(0)))
    for _ in range(200):
        if engine._in_flight:
            break
        await asyncio.sleep(0.01)
    assert engine._in_flight, "the request never reached the engine"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not engine._in_flight and not handle.server._tasks:
            break
        await asyncio.sleep(0.01)
    assert not engine._in_flight and not handle.server._tasks


async def test_dead_engine_fails_requests_in_flight_and_later_ones(clients):
    handle = LocalActor(FakeEngine(latency_s=30.0), ENGINE_METHODS)
    client = ZmqEngineClient(handle, node_id="node-a")
    clients += [client, handle]
    pending = [asyncio.create_task(client.generate(request(i))) for i in range(3)]
    await asyncio.sleep(0.2)
    handle.kill()
    done, _ = await asyncio.wait(pending, timeout=10)
    assert len(done) == 3, "requests in flight to a dead engine hung"
    for task in done:
        assert isinstance(task.exception(), ReplicaDeadError)
    with pytest.raises(ReplicaDeadError):
        await client.generate(request(9))


async def test_router_fails_over_from_a_dead_zmq_replica(clients):
    first, second = (
        LocalActor(FakeEngine(latency_s=0.5), ENGINE_METHODS),
        LocalActor(FakeEngine(), ENGINE_METHODS),
    )
    replicas = [
        ZmqEngineClient(first, node_id="node-a"),
        ZmqEngineClient(second, node_id="node-a"),
    ]
    clients += [*replicas, first, second]
    router = Router(replicas, load_poll_s=0, rotation_offset=0)
    task = asyncio.create_task(router.generate(request(0), env_key="env-0"))
    await asyncio.sleep(0.2)
    assert router.replica_for("env-0") == 0
    first.kill()
    result = await asyncio.wait_for(task, timeout=10)
    assert result.request_id == "r0" and len(second.target.requests) == 1
    assert router.stats()["replicas"][0]["dead"]


async def test_unreachable_socket_is_an_error_naming_the_address_not_a_hang(clients):
    """ZMQ retries an address nobody answers on forever; the client gives up after its connect timeout."""
    import socket

    with socket.socket() as probe:  # a free TCP port that nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    handle = LocalActor(FakeEngine(), ENGINE_METHODS, node_id="node-a")
    dead_end = CallEndpoint(
        node_id="node-a",
        ipc="ipc:///nonexistent/roll_async.sock",
        tcp=f"tcp://127.0.0.1:{port}",
    )

    async def endpoint():
        return dead_end

    handle.target.call_endpoint = endpoint
    client = ZmqEngineClient(handle, node_id="node-b", connect_timeout_s=0.5)
    clients += [client, handle]
    results = await asyncio.wait_for(
        asyncio.gather(
            *(client.generate(request(i)) for i in range(3)), return_exceptions=True
        ),
        10,
    )
    assert all(isinstance(r, ZmqConnectError) for r in results)
    assert f"tcp://127.0.0.1:{port}" in str(
        results[0]
    ) and "engine.request_transport: ray" in str(results[0])
