"""One command in a container through the Engine API's exec, with a deadline and an output cap.

Docker's exec has no timeout of its own, and a client that stops reading does not stop the process,
so the command runs under ``timeout -s KILL`` (coreutils puts the command in a process group of its own
and kills the whole group at the deadline) and the host reads the hijacked exec socket against a
deadline of its own, ``grace_s`` later: a process that left the group (``setsid``) and holds the output
open is found by the marker variable every process of the command inherits and killed from a second
exec. Output is read as it comes and kept as head and tail, so a command printing gigabytes costs the
cap, not the gigabytes.
"""

from __future__ import annotations

import select
import struct
import time
from dataclasses import dataclass
from typing import Any

from roll_async.workspaces.output_cap import cut_middle

#: Every process of one exec inherits ``ROLL_ASYNC_EXEC=<id>``; the deadline kill finds them by it.
MARKER_VAR = "ROLL_ASYNC_EXEC"
#: Exit status of a process killed by SIGKILL (128 + 9): timeout's kill, the OOM killer, kill -9.
KILLED = 137


class HeadTail:
    """Bytes kept as the first and the last ``limit // 2`` of a stream, with the count of those in between."""

    def __init__(self, limit: int) -> None:
        self.limit = max(2, limit)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        """Append ``data`` to the stream."""
        self.total += len(data)
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            keep = self.limit - self.limit // 2
            if len(self._tail) > 2 * keep:
                del self._tail[: len(self._tail) - keep]

    def text(self) -> tuple[str, bool]:
        """The kept output as text, and whether a middle was cut."""
        keep = self.limit - self.limit // 2
        tail = bytes(self._tail[-keep:]) if self._tail else b""
        return cut_middle(bytes(self._head), tail, self.total)


@dataclass(frozen=True)
class RawExec:
    """What the exec reported: its exit status (None: still running at the host deadline), its kept output."""

    exit_status: int | None
    output: str
    truncated: bool
    seconds: float
    deadline_hit: bool


def wrapped(command: str, timeout_s: float) -> list[str]:
    """The argv that runs ``command`` in a login bash under coreutils' group-killing ``timeout``.

    The shell sends its stderr into its stdout first: exec keeps the two as separate pipes, so only one
    pipe keeps what the command printed in the order it printed it.
    """
    seconds = f"{max(timeout_s, 0.001):.3f}"
    return ["timeout", "-s", "KILL", seconds, "bash", "-lc", f"exec 2>&1\n{command}"]


def kill_marked(marker: str) -> list[str]:
    """The argv (run as root) that SIGKILLs every process whose environment holds ``marker``."""
    script = (
        'for d in /proc/[0-9]*; do if tr "\\0" "\\n" < "$d/environ" 2>/dev/null'
        f' | grep -qx "{MARKER_VAR}={marker}"; then kill -9 "${{d#/proc/}}" 2>/dev/null; fi; done; true'
    )
    return ["sh", "-c", script]


def run_exec(
    api: Any,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    workdir: str,
    environment: dict[str, str],
    deadline_s: float,
    cap: int,
) -> RawExec:
    """Run ``argv`` in the container and read its output until it ends or ``deadline_s`` passes."""
    started = time.monotonic()
    exec_id = api.exec_create(
        container_id,
        argv,
        stdout=True,
        stderr=True,
        user=user,
        workdir=workdir,
        environment=environment,
    )["Id"]
    sock = api.exec_start(exec_id, socket=True)
    kept = HeadTail(cap)
    deadline_hit = False
    try:
        deadline_hit = not _read_frames(sock, kept, started + deadline_s)
    finally:
        sock.close()
    status: int | None = None
    pause = 0.02
    while not deadline_hit:
        # the output can end before the process does (it closed its stdout and stderr): wait for the exit
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            status = info.get("ExitCode")
            break
        deadline_hit = time.monotonic() + pause > started + deadline_s
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    output, truncated = kept.text()
    return RawExec(
        exit_status=status,
        output=output,
        truncated=truncated,
        seconds=time.monotonic() - started,
        deadline_hit=deadline_hit,
    )


def _read_frames(sock: Any, kept: HeadTail, deadline: float) -> bool:
    """Read the multiplexed stdout/stderr frames into ``kept``; False when ``deadline`` came first.

    Each frame is an 8-byte header (stream, 3 zero bytes, big-endian size) and its payload; stdout and
    stderr are kept in the order they arrive.
    """
    pending = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        readable, _, _ = select.select([sock], [], [], remaining)
        if not readable:
            return False
        chunk = sock.recv(65536) if hasattr(sock, "recv") else sock.read(65536)
        if not chunk:
            return True
        pending += chunk
        while len(pending) >= 8:
            _, size = struct.unpack(">BxxxL", pending[:8])
            if len(pending) < 8 + size:
                break
            kept.add(pending[8 : 8 + size])
            pending = pending[8 + size :]
