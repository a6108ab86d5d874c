"""Engine requests over ZMQ: the per-turn data plane between EnvManagerWorkers and an engine actor.

Every turn of every env is one ``generate`` request. As a Ray actor call it costs
about 1.3 ms of CPU per request, caller and callee together
(``benchmarks/ray_call_cost.py``); on a machine where the rollout shares cores
with the engine that CPU is taken from the engine's steps. Here the request goes
over a ZMQ DEALER/ROUTER pair instead (pickled ``GenerationRequest`` /
``GenerationResult``, the same types as over Ray), over an IPC socket when the
worker shares the engine's node and TCP otherwise. vLLM's own front-end talks to
its EngineCore the same way. Ray keeps the control plane: the endpoint is asked
once over Ray, and ``abort``, ``stats`` and weight updates stay Ray calls.

No silent hangs: the client watches its connection (a ZMQ socket monitor). When
the engine's process goes away the connection drops; the client then asks Ray
whether the actor is alive and, if it is dead, fails every request in flight
with ``ReplicaDeadError``, so the Router fails over exactly as with Ray calls.
A request cancelled by its caller is cancelled on the engine too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from roll_async.engine.router import RayEngineClient, ReplicaDeadError, replica_dead_error
from roll_async.protocol import GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

# Message kinds (first element of every pickled tuple).
_GENERATE, _CANCEL, _RESULT, _ERROR, _PING, _PONG = 0, 1, 2, 3, 4, 5

#: Seconds a liveness check over Ray may take before it counts as inconclusive (checked again on the next drop).
LIVENESS_TIMEOUT_S = 30.0
#: Seconds the first exchange on a new connection may take. ZMQ retries an unreachable address
#: silently forever; this turns a blocked port into an error that names it.
CONNECT_TIMEOUT_S = 30.0


class EngineConnectError(RuntimeError):
    """The engine's request socket did not answer: a port blocked between nodes, most likely."""


def _context() -> zmq.asyncio.Context:
    """The process's one ZMQ context (pyzmq's singleton), never terminated by us.

    A context's ``term()`` waits until every one of its sockets is closed; a per-object context
    reached by the garbage collector while any socket of it is left open blocks that process for
    good (seen in a benchmark driver). Sockets are closed explicitly; the shared context lives
    until the process exits, where pyzmq skips the wait.
    """
    return zmq.asyncio.Context.instance()


@dataclass(frozen=True)
class RequestEndpoint:
    """Where an engine actor takes requests: an IPC path for its own node, a TCP address for the others."""

    node_id: str
    ipc: str
    tcp: str

    def address_for(self, node_id: str | None) -> str:
        return self.ipc if node_id is not None and node_id == self.node_id else self.tcp


def _dumps(message: tuple) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _picklable_error(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError naming it."""
    try:
        pickle.loads(_dumps((exc,)))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class EngineRequestServer:
    """Serves ``engine.generate`` on a ROUTER socket; runs on the engine actor's event loop.

    One task per request, so requests run concurrently exactly as concurrent Ray calls do.
    """

    def __init__(self, engine: Any, *, node_id: str, tcp_host: str) -> None:
        self._engine = engine
        self._socket = _context().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        ipc = f"ipc://{os.path.join(tempfile.gettempdir(), f'roll_async_engine_{uuid.uuid4().hex[:12]}.sock')}"
        self._socket.bind(ipc)
        port = self._socket.bind_to_random_port(f"tcp://{tcp_host}")
        self.endpoint = RequestEndpoint(node_id=node_id, ipc=ipc, tcp=f"tcp://{tcp_host}:{port}")
        self._tasks: dict[tuple[bytes, int], asyncio.Task] = {}
        self._serve_task = asyncio.get_running_loop().create_task(self._serve())
        self.requests_served = 0

    async def _serve(self) -> None:
        while True:
            identity, frame = await self._socket.recv_multipart()
            try:
                kind, call_id, payload = pickle.loads(frame)
            except Exception as exc:  # a foreign or truncated message: nobody to answer
                logger.warning("engine request socket: unreadable message dropped (%s)", exc)
                continue
            key = (identity, call_id)
            if kind == _GENERATE:
                self._tasks[key] = asyncio.get_running_loop().create_task(self._generate(key, payload))
            elif kind == _CANCEL and key in self._tasks:
                self._tasks[key].cancel()
            elif kind == _PING:
                await self._socket.send_multipart([identity, _dumps((_PONG, call_id, None))])

    async def _generate(self, key: tuple[bytes, int], request: GenerationRequest) -> None:
        identity, call_id = key
        try:
            reply = (_RESULT, call_id, await self._engine.generate(request))
        except asyncio.CancelledError:
            return  # the caller cancelled it (and no longer waits), or the server is closing
        except Exception as exc:
            reply = (_ERROR, call_id, _picklable_error(exc))
        finally:
            self._tasks.pop(key, None)
        self.requests_served += 1
        await self._socket.send_multipart([identity, _dumps(reply)])

    def close(self) -> None:
        self._serve_task.cancel()
        for task in list(self._tasks.values()):
            task.cancel()
        self._socket.close(linger=0)
        ipc_path = self.endpoint.ipc.removeprefix("ipc://")
        try:
            os.unlink(ipc_path)
        except OSError:
            pass


def serve_requests(engine: Any) -> EngineRequestServer:
    """Open ``engine``'s request socket inside its Ray actor (node id and IP from Ray's runtime context)."""
    import ray

    return EngineRequestServer(
        engine, node_id=ray.get_runtime_context().get_node_id(), tcp_host=ray.util.get_node_ip_address()
    )


class ServesRequestsOverZmq:
    """For an engine class run as a Ray actor (VLLMEngine, FakeEngine): the socket ZmqEngineClient sends to."""

    _request_server: EngineRequestServer | None = None

    async def request_endpoint(self) -> RequestEndpoint:
        """Where EnvManagerWorkers send ``generate`` instead of Ray calls (the socket opens on the first ask)."""
        if self._request_server is None:
            self._request_server = serve_requests(self)
        return self._request_server.endpoint

    def close_request_socket(self) -> None:
        if self._request_server is not None:
            self._request_server.close()
            self._request_server = None


class ZmqEngineClient(RayEngineClient):
    """An engine actor seen as an EngineClient: ``generate`` over ZMQ; abort and stats are RayEngineClient's.

    The actor must offer ``request_endpoint()`` (VLLMEngine and FakeEngine do). The socket
    is opened on the first ``generate``, in the caller's event loop.
    """

    def __init__(self, handle: Any, *, node_id: str | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__(handle)
        self._node_id = node_id
        self._connect_timeout_s = connect_timeout_s
        self._pending: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._connect_lock = asyncio.Lock()
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []
        self._dead: str | None = None
        self._ready = False  # the first exchange (a ping) came back
        self._connect_error: EngineConnectError | None = None

    # -- connection --------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._ready:
            return
        async with self._connect_lock:
            if self._connect_error is not None:
                raise self._connect_error  # every caller gets the answer of the first attempt at once
            if not self._ready:
                try:
                    endpoint: RequestEndpoint = await self.handle.request_endpoint.remote()
                except self._dead_errors as exc:
                    raise replica_dead_error(exc) from exc
                socket = _context().socket(zmq.DEALER)
                socket.setsockopt(zmq.LINGER, 0)
                monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                monitor.setsockopt(zmq.LINGER, 0)
                address = endpoint.address_for(self._node_id)
                socket.connect(address)
                loop = asyncio.get_running_loop()
                self._tasks = [loop.create_task(self._read_replies(socket)), loop.create_task(self._watch(monitor))]
                self._socket, self._monitor = socket, monitor
                try:
                    await asyncio.wait_for(self._call(_PING, None), self._connect_timeout_s)
                except asyncio.TimeoutError:
                    self.close()
                    self._connect_error = EngineConnectError(
                        f"engine replica's request socket {address} did not answer within {self._connect_timeout_s:.0f}s "
                        f"(engine node {endpoint.node_id[:12]}, this node {str(self._node_id)[:12]}); open TCP ports "
                        "between the nodes or set engine.request_transport: ray"
                    )
                    raise self._connect_error from None
                self._ready = True

    async def _read_replies(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            kind, call_id, payload = pickle.loads(await socket.recv())
            future = self._pending.get(call_id)
            if future is None or future.done():
                continue  # cancelled meanwhile
            if kind in (_RESULT, _PONG):
                future.set_result(payload)
            else:
                future.set_exception(payload)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """On every dropped connection, ask Ray whether the engine actor is gone; if so, fail what is in flight."""
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            try:
                await asyncio.wait_for(self.stats(), LIVENESS_TIMEOUT_S)
                logger.warning("engine request connection dropped but the engine actor answers; reconnecting")
            except ReplicaDeadError as exc:
                self._fail_all(str(exc))
                return
            except asyncio.TimeoutError:
                logger.warning("engine request connection dropped and the actor did not answer in %.0fs", LIVENESS_TIMEOUT_S)

    def _fail_all(self, reason: str) -> None:
        self._dead = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ReplicaDeadError(reason))

    # -- EngineClient ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self._dead is not None:
            raise ReplicaDeadError(self._dead)
        await self._connect()
        return await self._call(_GENERATE, request)

    async def _call(self, kind: int, payload: Any) -> Any:
        """Send one message and wait for its answer; a cancelled wait cancels the engine's work."""
        socket = self._socket
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await socket.send(_dumps((kind, call_id, payload)))
            return await future
        except asyncio.CancelledError:
            answered = future.done() and not future.cancelled()  # cancelling the task cancels the future too
            if not answered and self._dead is None:
                try:  # the engine stops generating it; nobody waits for the answer
                    socket.send(_dumps((_CANCEL, call_id, None)), flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            raise
        finally:
            self._pending.pop(call_id, None)

    def close(self) -> None:
        """Close the socket and its monitor (idempotent)."""
        for task in self._tasks:
            task.cancel()
        if self._socket is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
        self._socket = self._monitor = None
