"""The ``roll-async env-server`` command: its arguments, its main, and starting it as a subprocess.

Running the server is separate from what it serves: parsing the command line,
raising the open-files limit, binding the socket and, for tests and benchmarks,
starting the command in a child process and waiting until it listens. Keeping
that here leaves :mod:`~roll_async.env_service.server` to the HTTP application.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import subprocess
import sys
import threading
import time
from typing import Any

from aiohttp import web

from roll_async.env_service.env_host import ISOLATION_MODES
from roll_async.env_service.fd_limit import raise_open_files_limit
from roll_async.env_service.server import EnvServer
from roll_async.errors import EnvServiceUnavailable

#: Most requests aiohttp's listening socket queues before accepting (2,000 sessions may connect at once).
LISTEN_BACKLOG = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: loopback only)",
    )
    parser.add_argument(
        "--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register envs with roll_async.envs.register_env); repeatable",
    )
    parser.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default="process",
        help="process (default): one child process per env",
    )
    parser.add_argument(
        "--env-timeout-s",
        type=float,
        default=60.0,
        help="default per-call timeout (a request may pass timeout_s)",
    )
    parser.add_argument(
        "--max-envs",
        type=int,
        default=None,
        help="most env instances held at once (429 beyond); default 256 with "
        "--isolation process, 4096 with none",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=32,
        help="threads kept free for short env calls (sync envs; process starts)",
    )
    parser.add_argument(
        "--max-threads",
        type=int,
        default=1024,
        help="most threads in all: slow or hung calls get extra threads up to this "
        "(a hung call holds its thread until it returns); default 1024",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=900.0,
        help="close an env nobody called for this long (its client died); 0 disables (default 900)",
    )


def main(args: argparse.Namespace) -> int:
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise SystemExit(
                f"roll-async env-server: --import {module}: {exc}"
            ) from None
    before, after = raise_open_files_limit()
    if after != before:
        print(
            f"roll-async env-server: raised the open-files limit from {before} to {after} "
            "(every session holds a connection)",
            flush=True,
        )
    if 0 <= after < 4096:
        print(
            f"roll-async env-server: warning: the open-files limit is {after} (the hard limit); "
            "each session holds a connection, so that many sessions at most",
            flush=True,
        )
    server = EnvServer(
        isolation=args.isolation,
        env_timeout_s=args.env_timeout_s,
        max_envs=args.max_envs,
        threads=args.threads,
        max_threads=args.max_threads,
        idle_timeout_s=args.idle_timeout_s,
    )

    async def serve() -> None:
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, backlog=LISTEN_BACKLOG)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(
            f"roll-async env-server listening on http://{args.host}:{port} (isolation={args.isolation})",
            flush=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


def _drain(stream: Any, tail: collections.deque[str]) -> None:
    """Read a child's output to its end, keeping the last lines (the pipe never fills)."""
    for line in stream:
        tail.append(line)


def launch_server_process(
    *extra_args: str, host: str = "127.0.0.1", timeout_s: float = 120.0
) -> tuple[Any, str]:
    """Start ``roll-async env-server`` as a subprocess on a free port; returns (Popen, url) once it listens.

    For tests and benchmarks; the caller terminates the process.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "roll_async.cli",
            "env-server",
            "--host",
            host,
            "--port",
            "0",
            *extra_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        lines.append(line)
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].split()[0]
            # Keep reading its output: a full pipe would block the server at its next log line.
            threading.Thread(
                target=_drain,
                args=(process.stdout, collections.deque(lines, maxlen=200)),
                name="env-server-output",
                daemon=True,
            ).start()
            return process, url
    process.kill()
    raise EnvServiceUnavailable("env-server did not start: " + "".join(lines[-20:]))
