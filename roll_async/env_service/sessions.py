"""The env server's table of sessions: the env ids it holds, each one's last call, and why a gone id went.

Answering calls exactly once, calling the envs and the HTTP handlers all look
env ids up and read or record calls; one table with its records (the hosted
env, the call and its answer or failure, the reason an id is gone) keeps them
agreeing on what an id means and lets each of those roles live in its own
module over it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from roll_async.errors import RollAsyncError

#: Closed or dropped env ids remembered (why, and a failed call to answer again), newest kept.
GONE_KEPT = 10_000


class CallFailed(RollAsyncError):
    """A call the server answers with an error: HTTP ``status`` and the wire's error ``kind``."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def again(self) -> CallFailed:
        """A fresh copy, to answer a repeat of the failed call."""
        return CallFailed(self.status, self.kind, str(self))


@dataclass
class CallRecord:
    """One call that changes an env (create, reset, step) and its answer, kept to answer a repeat.

    ``key`` is the call's op and arguments: a repeat must be the same call, not just the same number.
    """

    seq: int
    op: str
    key: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    response: dict[str, Any] | None = None
    failure: CallFailed | None = None

    def settle(
        self,
        response: dict[str, Any] | None = None,
        failure: CallFailed | None = None,
    ) -> None:
        self.response, self.failure = response, failure
        self.done.set()

    async def answer(self) -> dict[str, Any]:
        """The call's answer, once it has one (bounded: the call itself is bounded by its timeout)."""
        await self.done.wait()
        if self.failure is not None:
            raise self.failure.again()
        assert self.response is not None
        return self.response


@dataclass
class HostedEnv:
    """An env instance the server holds, the record of its session's last call, and when it was last used."""

    env: Any
    env_type: str
    last: CallRecord
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class GoneEnv:
    """Why an env id is no longer served, and its failed last call (answered again to a repeat)."""

    why: str
    failed: CallRecord | None = None


class SessionTable:
    """The envs held (``envs``), being built (``creating``) and gone (``gone``, the newest GONE_KEPT), by env id."""

    def __init__(self) -> None:
        self.envs: dict[str, HostedEnv] = {}
        #: envs being built, by id (a repeated create waits for the first one)
        self.creating: dict[str, HostedEnv] = {}
        self.gone: collections.OrderedDict[str, GoneEnv] = collections.OrderedDict()
        self._ids = itertools.count()

    def holds(self, env_id: str) -> bool:
        """The id is an env held or being built."""
        return env_id in self.envs or env_id in self.creating

    def get(self, env_id: str) -> HostedEnv | None:
        return self.envs.get(env_id) or self.creating.get(env_id)

    def new_id(self) -> str:
        """A server-chosen env id no env held or being built has."""
        env_id = f"e{next(self._ids)}"
        while self.holds(env_id):
            env_id = f"e{next(self._ids)}"
        return env_id

    def bury(self, env_id: str, why: str, failed: CallRecord | None = None) -> None:
        """Remember that ``env_id`` is gone and why (and its failed last call, answered again to a repeat)."""
        self.gone[env_id] = GoneEnv(why, failed)
        self.gone.move_to_end(env_id)
        while len(self.gone) > GONE_KEPT:
            self.gone.popitem(last=False)

    def not_found(self, env_id: str) -> CallFailed:
        """The 404 for an id not held: why it is gone, or that it was never here (or the server restarted)."""
        gone = self.gone.get(env_id)
        if gone is not None:
            return CallFailed(404, "not_found", f"env {env_id!r} is gone: {gone.why}")
        return CallFailed(
            404,
            "not_found",
            f"no env with id {env_id!r} on this server: never created here, or the server "
            "restarted since and lost it (envs do not survive a restart); start a new env",
        )


def call_key(*args: Any) -> str:
    """A call's arguments as one comparable string (a repeat must be the same call)."""
    return json.dumps(list(args), sort_keys=True, default=str)
