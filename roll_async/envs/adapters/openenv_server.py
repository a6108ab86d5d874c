"""The loopback OpenEnv server a worker process starts for ``openenv:<module:Class>`` envs.

An OpenEnv environment given by its Python class has no server yet; rather than one
server per env (a port, a thread and an event loop each), the envs of one worker process
that name the same class, types and constructor arguments share one uvicorn server on
127.0.0.1 (a free port), started by the first env and stopped when the last one closes.
Its ``max_concurrent_envs`` is the number of envs sharing it, so it is sized to the
worker's envs without being told that number, and a session beyond it is refused as
OpenEnv refuses it. A class that does not declare ``SUPPORTS_CONCURRENT_SESSIONS`` (OpenEnv
refuses more than one session per server for it) gets a server per env.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from roll_async.errors import EnvLibraryError

#: How long the first env waits for its server to listen.
START_TIMEOUT_S = 30.0


@dataclass
class _Hosted:
    """One running server and the envs that use it."""

    key: tuple[str, ...]
    url: str
    server: Any  # uvicorn.Server
    env_server: Any  # openenv HTTPEnvServer
    thread: threading.Thread
    users: int = 0


_LOCK = threading.Lock()
#: (class, action type, observation type, constructor kwargs) -> its server in this process.
_SERVERS: dict[tuple[str, ...], _Hosted] = {}


class LocalServerLease:
    """One env's share of a loopback server; ``release()`` (idempotent) stops the server after its last user."""

    def __init__(self, hosted: _Hosted) -> None:
        self._hosted: _Hosted | None = hosted
        self.url = hosted.url

    @property
    def max_concurrent_envs(self) -> int:
        """The sessions the server accepts now (the envs sharing it)."""
        hosted = self._hosted
        return 0 if hosted is None else _capacity(hosted.env_server)

    def release(self) -> None:
        hosted, self._hosted = self._hosted, None
        if hosted is None:
            return
        with _LOCK:
            hosted.users -= 1
            last = hosted.users <= 0
            if last:
                _SERVERS.pop(hosted.key, None)
            else:
                _set_capacity(hosted.env_server, hosted.users)
        if last:
            hosted.server.should_exit = True
            hosted.thread.join(timeout=10.0)


def acquire_local_server(
    env_cls: type[Any],
    action_cls: type[Any],
    observation_cls: type[Any],
    env_kwargs: dict[str, Any],
    env_type: str,
) -> LocalServerLease:
    """A lease on this process's server for ``env_cls`` (started on first use), with room for one more session.

    Raises:
        EnvLibraryError: The server did not start (the class's factory or uvicorn failed).
    """
    shared = bool(getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False))
    key = (
        _path(env_cls),
        _path(action_cls),
        _path(observation_cls),
        json.dumps(env_kwargs, sort_keys=True, default=repr),
    )
    with _LOCK:
        hosted = _SERVERS.get(key) if shared else None
        if hosted is None:
            hosted = _start(
                key,
                functools.partial(cast(Callable[..., Any], env_cls), **env_kwargs),
                action_cls,
                observation_cls,
                env_type,
            )
            if shared:
                _SERVERS[key] = hosted
        hosted.users += 1
        if hosted.users > 1:
            _set_capacity(hosted.env_server, hosted.users)
        return LocalServerLease(hosted)


def running_servers() -> int:
    """Shared servers running in this process (for tests: 0 once every env closed)."""
    with _LOCK:
        return len(_SERVERS)


def _start(
    key: tuple[str, ...],
    factory: Callable[[], Any],
    action_cls: type[Any],
    observation_cls: type[Any],
    env_type: str,
) -> _Hosted:
    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    env_server = HTTPEnvServer(
        factory, action_cls, observation_cls, max_concurrent_envs=1
    )
    app = FastAPI(title=f"roll-async loopback OpenEnv server for {key[0]}")
    env_server.register_routes(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", ws="websockets-sansio")
    )
    thread = threading.Thread(
        target=server.run,
        kwargs={"sockets": [sock]},
        name=f"openenv-server-{port}",
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise EnvLibraryError(
                f"env_type {env_type!r}: the loopback OpenEnv server for {key[0]} did not start within "
                f"{START_TIMEOUT_S:.0f} s (see the worker's log for uvicorn's error)"
            )
        time.sleep(0.01)
    return _Hosted(
        key=key,
        url=f"http://127.0.0.1:{port}",
        server=server,
        env_server=env_server,
        thread=thread,
    )


def _capacity(env_server: Any) -> int:
    return int(env_server.max_concurrent_envs)


def _set_capacity(env_server: Any, sessions: int) -> None:
    """Resize a running server: OpenEnv 0.2 reads ``_max_concurrent_envs`` when a session opens."""
    env_server._max_concurrent_envs = max(1, int(sessions))
    env_server._concurrency_config.max_concurrent_envs = max(1, int(sessions))


def _path(cls: type[Any]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
