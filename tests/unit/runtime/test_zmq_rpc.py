"""Actor methods over ZMQ (roll_async/runtime/zmq_calls.py) and the queue hand-overs that use it, without Ray.

The actor's handle is a local stand-in (tests/unit/local_actor.py): ``method.remote(...)`` calls the
object, and once the test "kills" it, every Ray call raises Ray's actor-death error and its socket is gone.
"""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayActorError

from roll_async.env_managers.worker import RaySchedulerClient
from roll_async.errors import CallConnectionLost, QueueActorDeadError
from roll_async.metrics import TRANSPORT_RECONNECTS, replica_metrics
from roll_async.runtime.zmq_calls import CallServer, ZmqCaller
from roll_async.scheduler.rollout_scheduler import QUEUE_HANDOVER_METHODS
from roll_async.trajectory import EpisodeSpec, Trajectory
from tests.unit.local_actor import LocalActor


class SlowQueue:
    """Hands out a seat only when the test says so; records what was handed over."""

    def __init__(self) -> None:
        self.seat_ready = asyncio.Event()
        self.handed_out: list[int] = []
        self.received: list[str] = []

    async def next_episode(
        self, env_id: int, incarnation: int = 0, handover_id: str | None = None
    ) -> EpisodeSpec | None:
        await self.seat_ready.wait()
        self.handed_out.append(env_id)
        return EpisodeSpec(
            tag="t", group_id=0, episode_id=env_id, seed=1, created_step=0
        )

    async def put_trajectory(
        self, trajectory: Trajectory, handover_id: str | None = None
    ) -> None:
        self.received.append(trajectory.traj_id)

    async def put_trajectory_and_next_episode(
        self,
        trajectory: Trajectory,
        incarnation: int = 0,
        handover_id: str | None = None,
    ) -> EpisodeSpec | None:
        await self.put_trajectory(trajectory)
        return await self.next_episode(trajectory.env_id, incarnation)

    async def ping(self) -> None:  # GroupQueueActor's liveness probe
        return None

    async def get_batch(
        self, batch_size: int, step: int
    ):  # not a hand-over: must not be served over ZMQ
        return []


@pytest.fixture
async def actors():
    made: list = []
    yield made
    for item in made:
        item.close()


def trajectory(env_id: int) -> Trajectory:
    return Trajectory(
        tag="t",
        group_id=0,
        episode_id=env_id,
        env_id=env_id,
        seed=1,
        traj_id=f"t-{env_id}",
        created_step=0,
    )


async def test_hand_overs_go_over_zmq_and_only_they_are_served(actors):
    queue = SlowQueue()
    actor = LocalActor(queue, QUEUE_HANDOVER_METHODS, cancellable=False)
    client = RaySchedulerClient(actor, transport="zmq")
    actors += [actor, client]
    queue.seat_ready.set()
    spec = await asyncio.wait_for(
        client.put_trajectory_and_next_episode(trajectory(3)), 10
    )
    assert (
        spec.episode_id == 3 and queue.received == ["t-3"] and actor.calls_served == 1
    )
    await asyncio.wait_for(client.put_trajectory(trajectory(4)), 10)
    assert queue.received == ["t-3", "t-4"]
    with pytest.raises(AttributeError, match="get_batch is not served over ZMQ"):
        await asyncio.wait_for(client._caller.call("get_batch", 1, 0), 10)


async def test_a_hand_over_whose_caller_gave_up_still_completes_on_the_queue(actors):
    # As with a Ray call: cancelling the caller does not cancel the queue's work half-way (a seat taken
    # but never returned); the queue finishes it, and a dead worker's seat goes back by the incarnation check.
    queue = SlowQueue()
    actor = LocalActor(queue, QUEUE_HANDOVER_METHODS, cancellable=False)
    client = RaySchedulerClient(actor, transport="zmq")
    actors += [actor, client]
    waiting = asyncio.create_task(client.next_episode(7))
    await asyncio.sleep(0.2)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    queue.seat_ready.set()
    for _ in range(100):
        if queue.handed_out:
            break
        await asyncio.sleep(0.02)
    assert queue.handed_out == [7]


async def test_a_dead_queue_actor_fails_waiting_hand_overs_with_a_named_error(actors):
    queue = SlowQueue()
    actor = LocalActor(queue, QUEUE_HANDOVER_METHODS, cancellable=False)
    client = RaySchedulerClient(actor, transport="zmq")
    actors += [actor, client]
    await asyncio.wait_for(client.put_trajectory(trajectory(1)), 10)  # connected
    waiting = asyncio.create_task(client.next_episode(1))
    await asyncio.sleep(0.2)
    actor.kill()
    with pytest.raises(QueueActorDeadError, match="GroupQueueActor died"):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(QueueActorDeadError):
        await asyncio.wait_for(client.next_episode(2), 10)


async def test_ray_transport_keeps_actor_calls():
    queue = SlowQueue()
    queue.seat_ready.set()
    actor = LocalActor(queue, QUEUE_HANDOVER_METHODS, cancellable=False)
    try:
        client = RaySchedulerClient(actor, transport="ray")
        assert (await client.next_episode(5)).episode_id == 5
        assert actor.calls_served == 0 and client._caller is None
        client.close()
    finally:
        actor.kill()


async def test_a_method_the_server_does_not_list_is_an_error_not_a_hang():
    class Echo:
        async def echo(self, value):
            return value

    server = CallServer(Echo(), ["echo"], node_id="n", tcp_host="127.0.0.1")

    async def endpoint():
        return server.endpoint

    async def probe():
        return None

    caller = ZmqCaller(
        endpoint=endpoint,
        probe=probe,
        dead_errors=(RayActorError,),
        dead_error=RuntimeError,
        what="echo",
        fallback="nothing",
        node_id="n",
    )
    try:
        assert await asyncio.wait_for(caller.call("echo", {"a": [1, 2]}), 10) == {
            "a": [1, 2]
        }
        with pytest.raises(AttributeError, match="Echo.missing"):
            await asyncio.wait_for(caller.call("missing"), 10)
    finally:
        caller.close()
        server.close()


class _Slow:
    """Answers ``wait`` only when the test says so."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def wait(self, value):
        self.calls += 1
        await self.release.wait()
        return value

    async def echo(self, value):
        return value

    async def ping(self) -> None:
        return None


def _caller_for(actor: LocalActor) -> ZmqCaller:
    return ZmqCaller(
        endpoint=actor.call_endpoint.remote,
        probe=actor.ping.remote,
        dead_errors=(RayActorError,),
        dead_error=RuntimeError,
        what="slow actor",
        fallback="nothing",
        node_id=actor.node_id,
    )


async def test_a_dropped_connection_to_a_live_actor_fails_the_pending_call_instead_of_hanging(
    actors,
):
    # The actor lives, but its socket is replaced: the caller reconnects under a new routing id, so the
    # answer to the call in flight goes to the old id and is dropped by the ROUTER. The call must fail
    # (a named error its caller can retry on), be counted, and the connection must still serve new calls.
    target = _Slow()
    actor = LocalActor(target, ["wait", "echo"], cancellable=False)
    caller = _caller_for(actor)
    actors += [actor, caller]
    assert await asyncio.wait_for(caller.call("echo", 1), 10) == 1
    pending = asyncio.create_task(caller.call("wait", 2))
    for _ in range(200):
        if target.calls:
            break
        await asyncio.sleep(0.01)
    actor.drop_connections()
    target.release.set()  # the old server's task would answer the old routing id
    with pytest.raises(CallConnectionLost, match="slow actor"):
        await asyncio.wait_for(pending, 10)
    assert caller.reconnects == 1
    assert await asyncio.wait_for(caller.call("echo", 3), 10) == 3


class _DedupQueue(SlowQueue):
    """Records each hand-over's id; answers a retried id with the first answer (as GroupQueueActor does)."""

    def __init__(self) -> None:
        super().__init__()
        self.handover_ids: list[str | None] = []
        self.answers: dict[str, asyncio.Task] = {}

    async def next_episode(self, env_id, incarnation=0, handover_id=None):
        self.handover_ids.append(handover_id)
        if handover_id not in self.answers:
            self.answers[handover_id] = asyncio.ensure_future(
                SlowQueue.next_episode(self, env_id, incarnation)
            )
        return await asyncio.shield(self.answers[handover_id])


async def test_a_hand_over_cut_by_a_dropped_connection_is_retried_with_the_same_id(
    actors,
):
    queue = _DedupQueue()
    actor = LocalActor(queue, QUEUE_HANDOVER_METHODS, cancellable=False)
    client = RaySchedulerClient(actor, transport="zmq")
    actors += [actor, client]
    waiting = asyncio.create_task(client.next_episode(7))
    for _ in range(200):
        if queue.handover_ids:
            break
        await asyncio.sleep(0.01)
    actor.drop_connections()
    for _ in range(500):
        if len(queue.handover_ids) == 2:
            break
        await asyncio.sleep(0.01)
    queue.seat_ready.set()
    spec = await asyncio.wait_for(waiting, 10)
    assert spec.episode_id == 7
    assert len(queue.handover_ids) == 2 and queue.handover_ids[0] is not None
    assert (
        queue.handover_ids[0] == queue.handover_ids[1]
    )  # the retry names the same hand-over
    assert queue.handed_out == [7]  # one seat, not two
    assert client.reconnects == 1


def test_dropped_connections_are_summed_over_workers_into_a_metric():
    workers = [
        {"replicas": [], "transport_reconnects": 2},
        {"replicas": [], "transport_reconnects": 1},
    ]
    assert replica_metrics([], workers)[TRANSPORT_RECONNECTS] == 3.0
