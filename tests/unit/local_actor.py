"""A Ray actor handle, in process, for tests of roll_async/runtime/zmq_calls.py without Ray.

``handle.method.remote(*args)`` calls the object's method; the object's ``call_endpoint`` opens a
local CallServer for ``methods`` (what ServesCallsOverZmq does inside a Ray actor). ``kill()`` is a
crash: the socket is gone and every Ray call raises Ray's actor-death error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

import zmq
from ray.exceptions import RayActorError

from roll_async.runtime.zmq_calls import CallEndpoint, CallServer


class _Method:
    def __init__(self, handle: LocalActor, name: str) -> None:
        self.handle, self.name = handle, name

    async def remote(self, *args: Any) -> Any:
        if self.handle.dead:
            raise RayActorError()
        result = getattr(self.handle.target, self.name)(*args)
        return await result if asyncio.iscoroutine(result) else result


class LocalActor:
    def __init__(
        self,
        target: Any,
        methods: Collection[str],
        *,
        node_id: str = "node-a",
        cancellable: bool = True,
    ) -> None:
        self.target, self.node_id, self.dead = target, node_id, False
        self._methods, self._cancellable = methods, cancellable
        self.server: CallServer | None = None
        target.call_endpoint = self._call_endpoint

    async def _call_endpoint(self) -> CallEndpoint:
        if self.server is None:
            self.server = CallServer(
                self.target,
                self._methods,
                node_id=self.node_id,
                tcp_host="127.0.0.1",
                name="test",
                cancellable=self._cancellable,
            )
        return self.server.endpoint

    @property
    def calls_served(self) -> int:
        return self.server.calls_served if self.server is not None else 0

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)

    def drop_connections(self) -> None:
        """The actor lives on but its callers' connections drop: the socket closes and a new one takes the
        same address, so each caller reconnects under a new routing id (answers to the old one are lost)."""
        old = self.server
        assert old is not None, "no call socket to drop"
        old.close()
        self.server = CallServer(
            self.target,
            self._methods,
            node_id=self.node_id,
            tcp_host="127.0.0.1",
            name="test",
            cancellable=self._cancellable,
        )
        socket = self.server._socket.socket
        socket.bind(old.endpoint.ipc)  # the old socket's IPC file is gone
        for _ in range(100):  # the old TCP port is free once ZMQ's I/O thread closed it
            try:
                socket.bind(old.endpoint.tcp)
                break
            except zmq.ZMQError:
                time.sleep(0.01)
        self.server.endpoint = old.endpoint

    def kill(self) -> None:
        self.dead = True
        self.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
