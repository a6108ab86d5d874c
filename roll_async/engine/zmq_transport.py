"""Engine requests over ZMQ: each turn's ``generate`` goes to the engine actor's call socket.

The transport itself is ``roll_async/zmq_rpc.py`` (why ZMQ, liveness, connect
errors). This module is what is engine-specific: an engine actor serves
``generate`` on its socket (``ServesRequestsOverZmq``), and ``ZmqEngineClient``
is an EngineClient whose ``generate`` goes there while ``abort``, ``stats`` and
weight updates stay Ray calls (``RayEngineClient``). A dead engine actor fails
the requests in flight with ``ReplicaDeadError``, so the Router fails over
exactly as with Ray calls; a cancelled request is cancelled on the engine too.
"""

from __future__ import annotations

from typing import Any

from roll_async.engine.router import RayEngineClient, ReplicaDeadError, replica_dead_error
from roll_async.protocol import GenerationRequest, GenerationResult
from roll_async.zmq_rpc import CONNECT_TIMEOUT_S, CallEndpoint, CallServer, ZmqCaller, serve_calls

#: What an engine actor serves over ZMQ.
ENGINE_METHODS = ("generate",)


class ServesRequestsOverZmq:
    """For an engine class run as a Ray actor (VLLMEngine, FakeEngine): the socket ZmqEngineClient sends to."""

    _request_server: CallServer | None = None

    async def request_endpoint(self) -> CallEndpoint:
        """Where EnvManagerWorkers send ``generate`` instead of Ray calls (the socket opens on the first ask)."""
        if self._request_server is None:
            self._request_server = serve_calls(self, ENGINE_METHODS, name="engine")
        return self._request_server.endpoint

    def close_request_socket(self) -> None:
        if self._request_server is not None:
            self._request_server.close()
            self._request_server = None


class ZmqEngineClient(RayEngineClient):
    """An engine actor seen as an EngineClient: ``generate`` over ZMQ; abort and stats are RayEngineClient's.

    The actor must offer ``request_endpoint()`` (VLLMEngine and FakeEngine do).
    """

    def __init__(self, handle: Any, *, node_id: str | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__(handle)
        self._caller = ZmqCaller(
            endpoint=self._request_endpoint,
            probe=self.stats,  # raises ReplicaDeadError for a dead actor
            dead_errors=(ReplicaDeadError,),
            dead_error=ReplicaDeadError,
            what="engine replica",
            fallback="engine.request_transport: ray",
            node_id=node_id,
            connect_timeout_s=connect_timeout_s,
        )

    async def _request_endpoint(self) -> CallEndpoint:
        try:
            return await self.handle.request_endpoint.remote()
        except self._dead_errors as exc:
            raise replica_dead_error(exc) from exc

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self._caller.call("generate", request)

    def close(self) -> None:
        """Close the socket and its monitor (idempotent)."""
        self._caller.close()
