"""Start a sandboxed runner, wait for it and reap it, and read how it ended.

A sandboxed run (``run_python``, an agent's shell command) is a runner process that supervises the
program and reports on a status pipe; what surrounds it (its own session, the backstop should the
supervisor not end it, killing the whole process group, closing both pipe ends) is security-critical
and lives here once, for every caller.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from typing import IO

#: Seconds past ``wall_s`` before the backstop kills a supervisor that has not ended the run itself.
_GRACE_S = 5.0


def run_supervised(
    argv_for: Callable[[int], list[str]],
    *,
    stdin: bytes,
    stdout: IO[bytes],
    stderr: IO[bytes],
    cwd: str,
    env: dict[str, str],
    wall_s: float,
) -> tuple[int | None, str, bool]:
    """Start the runner ``argv_for(status_fd)`` builds, wait for it, reap it: ``(returncode, report, backstop)``.

    The one place a sandboxed run (``run_python``, a shell command) is supervised: the runner ends
    itself at its deadline and reports on the status pipe; should it not, the backstop ends the wait
    ``_GRACE_S`` later. The process group is killed and both pipe ends closed before this returns.
    """
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            argv_for(write),
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            pass_fds=(write,),
            cwd=cwd,
            env=env,
        )
        os.close(write)
        write = -1
        backstop = False
        try:
            process.communicate(stdin, timeout=wall_s + _GRACE_S)
        except subprocess.TimeoutExpired:
            backstop = True
        finally:
            _kill_group(process.pid)
            process.wait()
        report = read_status(read)
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    return process.returncode, report, backstop


def exit_of(
    report: str, returncode: int | None, backstop: bool
) -> tuple[int | None, bool]:
    """(the program's exit code, negative for a signal; whether it timed out) from the supervisor's report.

    No report: the supervisor did not finish (killed by the backstop, or, running as the program's own
    uid under ``rlimits``, by the program), so its own exit status stands for the run.
    """
    kind, _, number = report.partition(" ")
    if kind == "timeout":
        return returncode, True
    if kind == "exit" and number.isdigit():
        return int(number), False
    if kind == "signal" and number.isdigit():
        return -int(number), False
    return returncode, backstop


def read_status(fd: int) -> str:
    """What the supervisor wrote on its status pipe (every writer has exited or was killed)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except OSError:
        return ""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
