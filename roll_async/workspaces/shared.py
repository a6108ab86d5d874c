"""One workspace runtime per worker process and event loop, shared by every env that asks for the same one.

A runtime is worth sharing: the docker runtime holds an Engine API client, a thread pool and a warm pool
of containers, and its start-up sweeps dead runs' containers, none of which should exist once per env.
So the envs of one worker process (whose async env calls all run on the worker's event loop) that name
the same runtime kind and settings lease one runtime: the first lease starts it, the last release shuts
it down (its containers removed). The pattern is the one of the per-worker OpenEnv server
(``roll_async.envs.adapters.openenv_server``). Runtimes are bound to the loop that started them (the
warm pool's tasks live there), so envs on another loop get their own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll_async.workspaces.factory import make_runtime
from roll_async.workspaces.interface import WorkspaceRuntime


@dataclass
class _Shared:
    """One running runtime, the loop it belongs to and how many envs hold it."""

    key: tuple[str, str]
    loop: asyncio.AbstractEventLoop
    runtime: WorkspaceRuntime
    users: int = 0


_LOCK = threading.Lock()
#: (kind, settings as JSON) -> the runtimes of this process, one per event loop.
_SHARED: dict[tuple[str, str], list[_Shared]] = {}


class RuntimeLease:
    """One env's share of a runtime; :meth:`release` (idempotent) shuts the runtime down after its last user."""

    def __init__(self, shared: _Shared) -> None:
        self._shared: _Shared | None = shared
        self.runtime = shared.runtime

    async def release(self) -> None:
        """Give the share back; the last one shuts the runtime down and removes what it holds."""
        shared, self._shared = self._shared, None
        if shared is None:
            return
        with _LOCK:
            shared.users -= 1
            last = shared.users <= 0
            if last:
                held = _SHARED.get(shared.key, [])
                if shared in held:
                    held.remove(shared)
                if not held:
                    _SHARED.pop(shared.key, None)
        if last:
            await shared.runtime.shutdown()


def acquire_runtime(kind: str, config: Mapping[str, Any] | None = None) -> RuntimeLease:
    """A lease on this loop's runtime of ``kind`` with ``config`` (the env_config's ``runtime_config``), started on first use.

    Must be called on the event loop the runtime will serve (an env's async ``reset``). Raises what
    :func:`~roll_async.workspaces.factory.make_runtime` raises (an unknown kind or key, no daemon).
    """
    loop = asyncio.get_running_loop()
    key = (kind, json.dumps(dict(config or {}), sort_keys=True, default=repr))
    with _LOCK:
        held = _SHARED.setdefault(key, [])
        # a loop that closed with its envs unclosed leaves an entry nobody can use: drop it
        held[:] = [s for s in held if not s.loop.is_closed()]
        shared = next((s for s in held if s.loop is loop), None)
        if shared is None:
            try:
                runtime = make_runtime(kind, config)
            except BaseException:
                if not held:
                    _SHARED.pop(key, None)
                raise
            shared = _Shared(key, loop, runtime)
            held.append(shared)
        shared.users += 1
        return RuntimeLease(shared)


def shared_runtimes() -> int:
    """Runtimes this process holds for envs now (0 once every env closed)."""
    with _LOCK:
        return sum(len(held) for held in _SHARED.values())
