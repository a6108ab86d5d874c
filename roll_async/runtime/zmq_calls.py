"""Async actor methods over ZMQ: the rollout's data plane, with Ray kept as the control plane.

A Ray actor call costs CPU on both sides, and the rollout makes one engine
request per turn and one queue hand-over per episode, on cores it may share with
the engine; here a call goes over a ZMQ DEALER/ROUTER pair instead (the same
pickled Python objects, IPC on one node, TCP across nodes), as vLLM's own
front-end talks to its EngineCore, while the endpoint and liveness are still
asked over Ray.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from roll_async.errors import CallConnectionLost, MethodNotServedError, ZmqConnectError

logger = logging.getLogger(__name__)

# Message kinds (first element of every pickled tuple).
_CALL, _CANCEL, _RESULT, _ERROR, _PING, _PONG = 0, 1, 2, 3, 4, 5

#: Seconds a liveness probe over Ray may take before it counts as inconclusive (checked again on the next drop).
LIVENESS_TIMEOUT_S = 30.0
#: Seconds the first exchange on a new connection may take. ZMQ retries an unreachable address
#: silently forever; this turns a blocked port into an error that names it.
CONNECT_TIMEOUT_S = 30.0


def _context() -> zmq.Context[zmq.Socket[bytes]]:
    """The process's one ZMQ context (pyzmq's singleton), never terminated by us.

    A context's ``term()`` waits until every one of its sockets is closed; a per-object context
    reached by the garbage collector while any socket of it is left open blocks that process for
    good (seen in a benchmark driver). Sockets are closed explicitly; the shared context lives
    until the process exits, where pyzmq skips the wait.

    Its I/O threads, started with the first socket, run under the scheduling policy of the thread
    that asks first (``roll_async/runtime/sched_policy.py`` sets the rollout's). Left alone, libzmq re-applies
    the policy glibc cached for the creating thread, which in a Ray actor predates the change.
    """
    global _context_configured
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    if not _context_configured and hasattr(os, "sched_getscheduler"):
        context.set(zmq.THREAD_SCHED_POLICY, os.sched_getscheduler(0))
        _context_configured = True
    return context


_context_configured = False


class _LoopSocket:
    """A ZMQ socket driven by the running event loop: ``on_message(frames)`` for every message received.

    ZMQ's file descriptor is edge-triggered and only says "look again": the reader callback drains
    every ready message, and after each send (which may consume that edge) the socket's events are
    checked again; a socket is also checked once when it is made (a pipe signals a message only after
    a read found it empty). Sends never block: queues are unbounded (a message per request in flight), and a
    full queue (zmq.Again) is retried on the next loop iterations.

    Sockets are plain (blocking-API) ZMQ sockets driven by the event loop
    (``_LoopSocket``): one reader callback drains every message that is ready, and a
    send goes out at once without blocking: pyzmq's ``zmq.asyncio`` sockets cost a future, a
    poller registration and several enum operations per message.
    """

    def __init__(
        self, socket: zmq.Socket[bytes], on_message: Callable[[list[bytes]], None]
    ) -> None:
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        self.socket = socket
        self._on_message = on_message
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, socket.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self._drain)
        self._closed = False
        # A pipe signals new messages only after a read found it empty: look once, so the first one is seen.
        self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        socket = self.socket
        while (
            not self._closed and cast(int, socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN
        ):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._on_message(frames)
            except Exception:  # a handler bug must not stop the socket
                logger.exception("zmq message handler failed")

    def send_now(self, frames: list[bytes]) -> bool:
        """Send without waiting; False if the queue is full (zmq.Again)."""
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        if cast(int, self.socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._loop.call_soon(self._drain)  # the send consumed the readable edge
        return True

    async def send(self, frames: list[bytes]) -> None:
        delay = 0.0005
        while not self.send_now(frames):
            if self._closed:
                raise zmq.ZMQError(zmq.ENOTSOCK, "socket closed")
            await asyncio.sleep(delay)
            delay = min(0.05, delay * 2)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self.socket.close(linger=0)


@dataclass(frozen=True)
class CallEndpoint:
    """Where an actor takes calls: an IPC path for its own node, a TCP address for the others."""

    node_id: str
    ipc: str
    tcp: str

    def address_for(self, node_id: str | None) -> str:
        return self.ipc if node_id is not None and node_id == self.node_id else self.tcp


def _dumps(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _picklable_error(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError naming it."""
    try:
        pickle.loads(_dumps((exc,)))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class CallServer:
    """Serves the ``async`` methods ``methods`` of ``target`` on a ROUTER socket; runs on the actor's event loop."""

    def __init__(
        self,
        target: Any,
        methods: Collection[str],
        *,
        node_id: str,
        tcp_host: str,
        name: str = "calls",
        cancellable: bool = True,
    ) -> None:
        self._target = target
        self._methods = frozenset(methods)
        self._cancellable = cancellable
        self._tasks: dict[tuple[bytes, int], asyncio.Task[None]] = {}
        self._loop = asyncio.get_running_loop()
        self._socket = _LoopSocket(
            _context().socket(zmq.ROUTER), self._on_message
        )  # options set before binding
        ipc = f"ipc://{os.path.join(tempfile.gettempdir(), f'roll_async_{name}_{uuid.uuid4().hex[:12]}.sock')}"
        self._socket.socket.bind(ipc)
        port = self._socket.socket.bind_to_random_port(f"tcp://{tcp_host}")
        self.endpoint = CallEndpoint(
            node_id=node_id, ipc=ipc, tcp=f"tcp://{tcp_host}:{port}"
        )
        self.calls_served = 0

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            logger.warning("call socket: message of %d frames dropped", len(frames))
            return
        identity, frame = frames
        try:
            kind, call_id, payload = pickle.loads(frame)
        except Exception as exc:  # a foreign or truncated message: nobody to answer
            logger.warning("call socket: unreadable message dropped (%s)", exc)
            return
        key = (identity, call_id)
        if kind == _CALL:
            self._tasks[key] = self._loop.create_task(self._run(key, *payload))
        elif kind == _CANCEL and self._cancellable and key in self._tasks:
            self._tasks[key].cancel()
        elif kind == _PING:
            self._reply(identity, (_PONG, call_id, None))

    def _reply(self, identity: bytes, message: tuple[Any, ...]) -> None:
        frames = [identity, _dumps(message)]
        if not self._socket.send_now(frames):
            self._loop.create_task(self._socket.send(frames))

    async def _run(
        self, key: tuple[bytes, int], method: str, args: tuple[Any, ...]
    ) -> None:
        identity, call_id = key
        try:
            if method not in self._methods:
                raise MethodNotServedError(
                    f"{type(self._target).__name__}.{method} is not served over ZMQ (serves {sorted(self._methods)})"
                )
            reply = (_RESULT, call_id, await getattr(self._target, method)(*args))
        except asyncio.CancelledError:
            return  # the caller cancelled it (and no longer waits), or the server is closing
        except Exception as exc:
            reply = (_ERROR, call_id, _picklable_error(exc))
        finally:
            self._tasks.pop(key, None)
        self.calls_served += 1
        self._reply(identity, reply)

    async def reopen(self) -> None:
        """Fault injection: drop every caller's connection while the actor lives on.

        The socket closes and a new one binds the same addresses; calls in flight keep running
        and their answers go to routing ids the new socket does not know (dropped, as after a
        real drop), so callers see ``CallConnectionLost``, reconnect and retry. Used by the chaos
        soak (``benchmarks/chaos.py``) through ``ServesCallsOverZmq.drop_call_connections``.
        """
        self._socket.close()
        try:
            os.unlink(self.endpoint.ipc.removeprefix("ipc://"))
        except OSError:
            pass
        socket = _LoopSocket(_context().socket(zmq.ROUTER), self._on_message)
        socket.socket.bind(self.endpoint.ipc)
        for _ in range(
            200
        ):  # the TCP port is free once ZMQ's I/O thread closed the old socket
            try:
                socket.socket.bind(self.endpoint.tcp)
                break
            except zmq.ZMQError:
                await asyncio.sleep(0.01)
        else:
            raise ZmqConnectError(f"call socket: {self.endpoint.tcp} did not come free")
        self._socket = socket

    def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        self._socket.close()
        try:
            os.unlink(self.endpoint.ipc.removeprefix("ipc://"))
        except OSError:
            pass


def serve_calls(
    target: Any, methods: Collection[str], *, name: str, cancellable: bool = True
) -> CallServer:
    """Open ``target``'s call socket inside its Ray actor (node id and IP from Ray's runtime context)."""
    import ray  # only inside a Ray actor; importing this module must not import Ray

    return CallServer(
        target,
        methods,
        node_id=ray.get_runtime_context().get_node_id(),
        tcp_host=ray.util.get_node_ip_address(),
        name=name,
        cancellable=cancellable,
    )


class ServesCallsOverZmq:
    """For a class run as a Ray actor: serves ``ZMQ_METHODS`` on a call socket that opens on the first
    ``call_endpoint()`` (asked over Ray by a ZmqCaller) and closes on ``close_call_socket()``."""

    ZMQ_METHODS: tuple[str, ...] = ()
    ZMQ_NAME: str = "calls"
    #: False: a call whose caller gave up still runs to its end on the actor, as a Ray call does.
    ZMQ_CANCELLABLE: bool = True
    _call_server: CallServer | None = None

    async def call_endpoint(self) -> CallEndpoint:
        if self._call_server is None:
            self._call_server = serve_calls(
                self,
                self.ZMQ_METHODS,
                name=self.ZMQ_NAME,
                cancellable=self.ZMQ_CANCELLABLE,
            )
        return self._call_server.endpoint

    async def close_call_socket(self) -> None:
        """Async so that, in an async Ray actor, it runs on the event loop the server's tasks live on."""
        if self._call_server is not None:
            self._call_server.close()
            self._call_server = None

    async def drop_call_connections(self) -> bool:
        """Fault injection (the chaos soak): every caller's connection drops, the actor and its calls live on
        (``CallServer.reopen``); False when no call socket is open."""
        if self._call_server is None:
            return False
        await self._call_server.reopen()
        return True

    @property
    def calls_served(self) -> int:
        return self._call_server.calls_served if self._call_server is not None else 0


class ZmqCaller:
    """The caller's side of a CallServer. The socket opens on the first call, in the caller's event loop.

    ``endpoint``: asks the actor (over Ray) where its socket is. ``probe``: a Ray call that raises one of
    ``dead_errors`` when the actor is gone; then every call in flight, and every later one, fails with
    ``dead_error(reason)``. ``what`` names the actor and ``fallback`` the setting that avoids ZMQ, for the
    connect error.

    No silent hangs: the caller watches its connection (a ZMQ socket monitor). When
    the actor's process goes away the connection drops; the caller then runs its
    ``probe`` (a Ray call) and, if that says the actor is dead, fails every call in
    flight with the caller's ``dead_error``. If the actor lives (or does not answer
    the probe), the calls that were in flight when the connection dropped fail with
    ``CallConnectionLost`` (counted in ``reconnects``): the socket reconnects under a
    new routing id and the ROUTER drops their answers, so waiting would be forever;
    a caller whose call is idempotent retries it. A first call that gets no answer within
    ``connect_timeout_s`` (a TCP port blocked between nodes: ZMQ would retry
    silently forever) fails with ``ZmqConnectError`` naming the address and the
    setting that avoids ZMQ. A call cancelled by its caller is cancelled on the
    server too when the server was opened with ``cancellable=True``; otherwise the
    server finishes it, as Ray does with an abandoned actor call.
    """

    def __init__(
        self,
        *,
        endpoint: Callable[[], Awaitable[CallEndpoint]],
        probe: Callable[[], Awaitable[Any]],
        dead_errors: tuple[type[BaseException], ...],
        dead_error: Callable[[str], BaseException],
        what: str,
        fallback: str,
        node_id: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._endpoint = endpoint
        self._probe = probe
        self._dead_errors = dead_errors
        self._dead_error = dead_error
        self._what = what
        self._fallback = fallback
        self._node_id = node_id
        self._connect_timeout_s = connect_timeout_s
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._connect_lock = asyncio.Lock()
        self._socket: _LoopSocket | None = None
        self._monitor: _LoopSocket | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.dead: str | None = None
        self._ready = False  # the first exchange (a ping) came back
        self._connect_error: ZmqConnectError | None = None
        #: Calls in flight when the connection dropped: their answers cannot come back.
        self._cut_off: set[int] = set()
        #: Connections that dropped while the actor lived on (their calls failed with CallConnectionLost).
        self.reconnects = 0

    async def call(self, method: str, *args: Any) -> Any:
        if self.dead is not None:
            raise self._dead_error(self.dead)
        await self._connect()
        return await self._send(_CALL, (method, args))

    # -- connection --------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._ready:
            return
        async with self._connect_lock:
            if self._connect_error is not None:
                raise self._connect_error  # every caller gets the answer of the first attempt at once
            if self._ready:
                return
            endpoint = await self._endpoint()
            socket = _context().socket(zmq.DEALER)
            monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            address = endpoint.address_for(self._node_id)
            self._socket = _LoopSocket(socket, self._on_reply)
            self._monitor = _LoopSocket(monitor, self._on_monitor_event)
            socket.connect(address)
            try:
                await asyncio.wait_for(self._send(_PING, None), self._connect_timeout_s)
            except CallConnectionLost:
                self.close()  # dropped during the first exchange: the next call connects afresh
                raise
            except TimeoutError:
                self.close()
                self._connect_error = ZmqConnectError(
                    f"{self._what}'s call socket {address} did not answer within {self._connect_timeout_s:.0f}s "
                    f"(its node {endpoint.node_id[:12]}, this node {str(self._node_id)[:12]}); open TCP ports "
                    f"between the nodes or set {self._fallback}"
                )
                raise self._connect_error from None
            self._ready = True

    def _on_reply(self, frames: list[bytes]) -> None:
        kind, call_id, payload = pickle.loads(frames[-1])
        future = self._pending.get(call_id)
        if future is None or future.done():
            return  # cancelled meanwhile
        if kind in (_RESULT, _PONG):
            future.set_result(payload)
        else:
            future.set_exception(payload)

    def _on_monitor_event(self, frames: list[bytes]) -> None:
        if (
            parse_monitor_message(frames)["event"] != zmq.EVENT_DISCONNECTED
            or self.dead is not None
        ):
            return
        # Only calls sent before the drop are lost; later ones wait in the socket for the new connection.
        self._cut_off.update(self._pending)
        # one liveness probe at a time
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(
                self._check_liveness()
            )

    async def _check_liveness(self) -> None:
        """The connection dropped: ask Ray whether the actor is gone; if so, fail what is in flight."""
        try:
            await asyncio.wait_for(self._probe(), LIVENESS_TIMEOUT_S)
            state = "the actor answers"
        except self._dead_errors as exc:
            self._fail_all(str(exc))
            return
        except TimeoutError:
            state = f"the actor did not answer in {LIVENESS_TIMEOUT_S:.0f}s"
        self.reconnects += 1
        cut_off, self._cut_off = self._cut_off, set()
        lost = [
            self._pending[i]
            for i in sorted(cut_off)
            if i in self._pending and not self._pending[i].done()
        ]
        logger.warning(
            "%s: call connection dropped and %s; reconnecting, %d call(s) in flight fail with "
            "CallConnectionLost",
            self._what,
            state,
            len(lost),
        )
        for future in lost:
            future.set_exception(
                CallConnectionLost(
                    f"{self._what}: the call connection dropped while this call was in flight "
                    f"({state}); its answer is lost"
                )
            )

    def _fail_all(self, reason: str) -> None:
        self.dead = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._dead_error(reason))

    async def _send(self, kind: int, payload: Any) -> Any:
        """Send one message and wait for its answer; a cancelled wait tells the server (see CallServer)."""
        socket = self._socket
        assert socket is not None, "_send runs after _connect opened the socket"
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            await socket.send(
                [_dumps((kind, call_id, payload))]
            )  # at once unless the queue is full
            return await future
        except asyncio.CancelledError:
            # cancelling the task cancels the future too
            answered = future.done() and not future.cancelled()
            if not answered and self.dead is None and self._socket is socket:
                try:
                    socket.send_now([_dumps((_CANCEL, call_id, None))])
                except zmq.ZMQError:
                    pass
            raise
        finally:
            self._pending.pop(call_id, None)
            self._cut_off.discard(call_id)

    def close(self) -> None:
        """Close the socket and its monitor (idempotent)."""
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self._socket is not None:
            self._socket.socket.disable_monitor()
            if self._monitor is not None:  # opened with the socket
                self._monitor.close()
            self._socket.close()
        self._socket = self._monitor = None
