"""Applying each env call once: sequence numbers, repeats answered from the record, calls that outlive requests.

A client that lost an answer resends the call, so every call that changes an
env carries its session's sequence number and the server must tell the next
call from a repeat, answer a repeat from the record without applying it again,
and finish a call whose requester went away. Those rules are the server's
exactly-once contract (see :mod:`~roll_async.env_service.wire`); they live here,
apart from the HTTP handlers and from how envs are called.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from roll_async.env_service.process_env import ProcessEnv
from roll_async.env_service.server_stats import ServerStats
from roll_async.env_service.sessions import (
    CallFailed,
    CallRecord,
    HostedEnv,
    SessionTable,
)
from roll_async.env_service.wire import require

#: ``run(env_id, hosted)``: apply a sequenced call to the env and return its answer.
SequencedRun = Callable[[str, HostedEnv], Awaitable[dict[str, Any]]]


class ExactlyOnceCalls:
    """Runs the calls of the env sessions in ``sessions`` exactly once, counting repeats and refusals in ``stats``."""

    def __init__(self, sessions: SessionTable, stats: ServerStats) -> None:
        self._sessions = sessions
        self._stats = stats

    async def sequenced(
        self, body: Any, seq: int, op: str, key: str, run: SequencedRun
    ) -> dict[str, Any]:
        """Apply call ``seq`` of an env's session once: the next number runs, the last one is answered again."""
        env_id = require(body, "env_id", str)
        hosted = self.session(env_id, seq, op, key)
        if hosted is None:
            raise self._sessions.not_found(env_id)
        last = hosted.last
        if seq == last.seq:
            return await self.repeat(env_id, last, seq, op, key)
        if seq != last.seq + 1:
            self._stats.out_of_sequence += 1
            raise CallFailed(
                409,
                "out_of_sequence",
                f"env {env_id!r}: {op} seq={seq} is neither the next call (seq={last.seq + 1}) "
                f"nor a repeat of the last (seq={last.seq}); nothing was applied: close this env "
                "and start a new one",
            )
        if not last.done.is_set():
            raise CallFailed(
                409,
                "busy",
                f"env {env_id!r} is still running call seq={last.seq}; wait for its answer",
            )
        applied = CallRecord(seq, op, key)
        hosted.last = applied
        return await self.apply_once(
            env_id, hosted, applied, last, functools.partial(run, env_id, hosted)
        )

    async def apply_once(
        self,
        env_id: str,
        hosted: HostedEnv,
        applied: CallRecord,
        before: CallRecord | None,
        run: Callable[[], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Run ``run()`` and record its answer in ``applied``, even if the request that asked is gone.

        The call runs as its own task: a client that disconnects mid-call does not cancel it, and its
        retry gets the answer. A failure that left the env in place (not called: 503, 409) frees the
        number again (``before`` is the record again); one that dropped the env is remembered.
        """
        sessions = self._sessions

        async def settle() -> dict[str, Any]:
            try:
                response = await run()
            except CallFailed as exc:
                if sessions.holds(env_id):
                    if before is not None:
                        hosted.last = before
                elif exc.status >= 500 and exc.kind != "overloaded":
                    sessions.bury(env_id, str(exc), applied)
                applied.settle(failure=exc)
                raise
            except BaseException as exc:
                failure = CallFailed(
                    500, "env_error", f"{applied.op} seq={applied.seq}: {exc!r}"
                )
                sessions.bury(env_id, str(failure), applied)
                dropped = sessions.envs.pop(env_id, None)
                if dropped is not None and isinstance(dropped.env, ProcessEnv):
                    dropped.env.kill("its call was interrupted")
                applied.settle(failure=failure)
                raise
            applied.settle(response=response)
            return response

        task = asyncio.ensure_future(settle())
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def repeat(
        self, env_id: str, applied: CallRecord, seq: int, op: str, key: str
    ) -> dict[str, Any]:
        """Answer a repeat of ``applied`` from its record; the same number for another call is 409."""
        if (applied.op, applied.key) != (op, key):
            self._stats.out_of_sequence += 1
            raise CallFailed(
                409,
                "out_of_sequence",
                f"env {env_id!r}: seq={seq} was already used for a {applied.op} with other "
                "arguments; a repeat must resend the same call",
            )
        self._stats.repeats += 1
        return await applied.answer()

    def session(self, env_id: str, seq: int, op: str, key: str) -> HostedEnv | None:
        """The env's record; None if the id is unknown; a gone env's failed call is answered again."""
        hosted = self._sessions.get(env_id)
        if hosted is not None:
            return hosted
        gone = self._sessions.gone.get(env_id)
        if gone is None:
            return None
        failed = gone.failed
        if failed is not None and (failed.seq, failed.op, failed.key) == (seq, op, key):
            assert failed.failure is not None
            self._stats.repeats += 1
            raise failed.failure.again()
        raise CallFailed(404, "not_found", f"env {env_id!r} is gone: {gone.why}")


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a call task's failure as seen: its requester may be gone, and its record holds the answer."""
    if not task.cancelled():
        task.exception()
