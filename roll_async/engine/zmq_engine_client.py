"""Engine requests over ZMQ: each turn's ``generate`` goes to the engine actor's call socket.

Ray actor calls cost CPU the engine needs, so the per-turn ``generate`` uses the
ZMQ transport of :mod:`roll_async.runtime.zmq_calls` while ``abort``, ``stats``
and weight updates stay Ray calls; a dead engine actor still fails the requests
in flight with ``ReplicaDeadError``, so the Router fails over as with Ray calls.
"""

from __future__ import annotations

from typing import Any

from roll_async.engine.router import RayEngineClient
from roll_async.errors import ReplicaDeadError
from roll_async.runtime.zmq_calls import (
    CONNECT_TIMEOUT_S,
    ServesCallsOverZmq,
    ZmqCaller,
)
from roll_async.trajectory import GenerationRequest, GenerationResult

#: What an engine actor serves over ZMQ.
ENGINE_METHODS = ("generate",)


class ServesRequestsOverZmq(ServesCallsOverZmq):
    """For an engine class run as a Ray actor (VLLMEngine, FakeEngine): the socket ZmqEngineClient sends to
    (a cancelled request is cancelled on the engine)."""

    ZMQ_METHODS = ENGINE_METHODS
    ZMQ_NAME = "engine"


class ZmqEngineClient(RayEngineClient):
    """An engine actor seen as an EngineClient: ``generate`` over ZMQ; abort and stats are RayEngineClient's.

    The actor must offer ``call_endpoint()`` (ServesRequestsOverZmq: VLLMEngine and FakeEngine do).
    """

    def __init__(
        self,
        handle: Any,
        *,
        node_id: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        super().__init__(handle)
        self._caller = ZmqCaller(
            endpoint=lambda: self._remote("call_endpoint"),
            probe=self.stats,  # raises ReplicaDeadError for a dead actor
            dead_errors=(ReplicaDeadError,),
            dead_error=ReplicaDeadError,
            what="engine replica",
            fallback="engine.request_transport: ray",
            node_id=node_id,
            connect_timeout_s=connect_timeout_s,
        )

    @property
    def reconnects(self) -> int:
        """Times the call connection dropped while the replica lived (requests in flight were retried)."""
        return self._caller.reconnects

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result: GenerationResult = await self._caller.call("generate", request)
        return result

    def close(self) -> None:
        """Close the socket and its monitor (idempotent)."""
        self._caller.close()
