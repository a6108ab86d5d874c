"""Run one shell command in a workspace directory through the namespace sandbox of :mod:`.sandbox`.

An agent in a shell runs commands a model wrote, so each one gets what ``run_python`` gives a
program (its own PID, mount and network namespaces, a uid of its own, CPU, memory, process and
file-size limits, a supervisor that ends it at its deadline) with one difference: one directory,
the workspace, stays writable and is the working directory, so what the agent changes there lasts
from one command to the next. Everything else is read-only, and /tmp is a fresh tmpfs per command.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

from roll_async.errors import InvalidInputError
from roll_async.workspaces.output_cap import cut_middle
from roll_async.workspaces.sandbox import (
    SandboxLimits,
    _command,
    network_isolation,
    process_isolation,
)
from roll_async.workspaces.supervisor import exit_of, run_supervised


@dataclass(frozen=True)
class ShellLimits:
    """Limits of one command: wall clock (also its CPU seconds), memory per process, processes of its uid,
    the largest file it may write (its output file included), its private /tmp and the output kept."""

    timeout_s: float = 30.0
    memory_mb: int = 1024
    max_processes: int = 256
    file_size_mb: int = 64
    tmp_mb: int = 64
    max_files: int = 8192
    max_output_bytes: int = 64 * 1024
    network: bool = False


@dataclass(frozen=True)
class ShellResult:
    """How the command ended; ``exit_code`` is None when it ran past its deadline."""

    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    seconds: float


def run_shell(
    command: str,
    *,
    uid: int,
    writable: str,
    workdir: str,
    env: dict[str, str],
    limits: ShellLimits,
) -> ShellResult:
    """Run ``bash -lc command`` as ``uid`` in ``workdir`` with only ``writable`` writable; never raises for what it does.

    Needs PID and mount namespaces (``process_isolation("namespaces")`` raises
    ``UnsupportedHostError`` where they are missing): every process the command started is gone
    when this returns, background ones included. stdout and stderr are one stream, cut to
    ``max_output_bytes`` keeping head and tail.
    """
    if uid < 0 or not os.path.isabs(writable):
        raise InvalidInputError(
            f"run_shell needs a uid >= 0 and an absolute writable directory, got uid={uid}, writable={writable!r}"
        )
    process_isolation("namespaces")
    sandbox = SandboxLimits(
        cpu_s=limits.timeout_s,
        wall_s=limits.timeout_s,
        memory_mb=limits.memory_mb,
        max_output_bytes=int(limits.file_size_mb) * 1024 * 1024,
        max_processes=limits.max_processes,
        network=limits.network,
        disk_mb=limits.tmp_mb,
        max_files=limits.max_files,
        sandbox_isolation="namespaces",
    )
    guard_net = int(not limits.network and network_isolation() != "netns")
    # the runner execs bash in place of a Python program (its modules were loaded before the uid drop)
    source = f"import os\nos.execv('/bin/bash', ['bash', '-lc', {command!r}])\n"
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        returncode, report, backstop = run_supervised(
            lambda status_fd: _command(
                sandbox,
                uid=uid,
                status_fd=status_fd,
                guard_net=guard_net,
                tmpfs_bytes=max(1, int(limits.tmp_mb)) * 1024 * 1024,
                pidns=True,
                deadline=started + float(limits.timeout_s),
                writable=writable,
                workdir=workdir,
            ),
            stdin=source.encode("utf-8", "replace"),
            stdout=out,
            stderr=out,
            cwd="/",
            env={"HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", **env},
            wall_s=float(limits.timeout_s),
        )
        seconds = time.monotonic() - started
        out.seek(0, os.SEEK_END)
        size = out.tell()
        cap = max(2, int(limits.max_output_bytes))
        half = cap // 2
        out.seek(0)
        head = out.read(half if size > cap else cap)
        tail = b""
        if size > cap:
            out.seek(size - (cap - half))
            tail = out.read()
    code, timed_out = exit_of(report, returncode, backstop)
    text, truncated = cut_middle(head, tail, size)
    return ShellResult(
        exit_code=None if timed_out else code,
        output=text,
        timed_out=timed_out,
        truncated=truncated,
        seconds=seconds,
    )
