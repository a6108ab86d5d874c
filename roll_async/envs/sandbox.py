"""Run untrusted Python in a child process with CPU-time, memory, process, output and network limits.

Code written by a model may loop, allocate without bound, fork, flood its
output or reach the network; the code env and its grader run it here so none
of that can touch the host, and the whole process group is killed before a
call returns.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

_NOBODY = 65534
#: Imported before dropping to ``nobody``: an interpreter under a private directory (e.g. /root/.pyenv)
#: cannot be read afterwards, so these are the modules such code can use there.
_PRELOAD = (
    "abc array bisect collections copy dataclasses datetime decimal enum fractions functools heapq itertools json "
    "math operator random re socket statistics string textwrap time typing unicodedata encodings.idna"
).split()

_RUNNER = r"""
import os, resource, sys
source = sys.stdin.buffer.read().decode("utf-8", "replace")
fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
cpu_s, memory, fsize, nproc, guard_net = (int(x) for x in sys.argv[1:6])
if os.getuid() == 0:
    for name in %(preload)r:
        try:
            __import__(name)
        except ImportError:
            pass
    os.setgroups([]); os.setgid(%(nobody)d); os.setuid(%(nobody)d)
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if guard_net:
    import socket, _socket
    def _no_network(*args, **kwargs):
        raise PermissionError("network access is disabled in this sandbox")
    for mod in (socket, _socket):
        for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
            if hasattr(mod, name):
                setattr(mod, name, _no_network)
del os, resource, fd, cpu_s, memory, fsize, nproc, guard_net
sys.argv = ["solution.py"]
exec(compile(source, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
""" % {"nobody": _NOBODY, "preload": _PRELOAD}  # noqa: UP031 (a %-template keeps the braces of the code it holds)


@dataclass
class SandboxLimits:
    """Limits of one sandboxed run (see :func:`run_python` for how each is enforced)."""

    cpu_s: float = 2.0
    wall_s: float = 5.0
    memory_mb: int = 256
    max_output_bytes: int = 16 * 1024
    max_processes: int = 32
    network: bool = False


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    #: ok | error (non-zero exit) | timeout (wall clock) | cpu_limit | memory_limit | output_limit | killed
    status: str
    seconds: float
    output_truncated: bool = False

    def report(self, max_chars: int = 1200) -> str:
        """The observation text: status line, then stdout and stderr, each cut to ``max_chars``."""
        lines = [f"[exit code {self.exit_code}, {self.status}, {self.seconds:.2f}s]"]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text:
                lines.append(f"{name}:\n{truncate(text, max_chars)}")
        if self.output_truncated:
            lines.append("(output limit reached: the rest was not kept)")
        return "\n".join(lines)


def truncate(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [{len(text) - max_chars} more characters cut]"


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """``netns`` when ``unshare --net`` works here (a kernel-level block), else ``socket_guard``."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "socket_guard"
    try:
        ok = (
            subprocess.run(
                [unshare, "--net", "true"], capture_output=True, timeout=10
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        ok = False
    return "netns" if ok else "socket_guard"


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` under ``limits``; never raises for anything the code does.

    ``run_python(code, limits)`` starts ``python -I -S`` (isolated, no site
    packages) in a new session; the runner sets its own rlimits before it runs
    the code, so no ``preexec_fn`` is needed (that is unsafe in threaded
    processes such as a Ray worker):

    * **CPU time** ``RLIMIT_CPU``: past it the kernel sends SIGXCPU; a wall-clock
      limit (``wall_s``) kills the whole process group for code that sleeps or blocks.
    * **Memory** ``RLIMIT_AS``: an allocation past it raises MemoryError.
    * **Processes** ``RLIMIT_NPROC``: root ignores it, so when we run as root the
      runner first drops to uid/gid ``nobody`` (65534); a fork bomb then fails with
      "Resource temporarily unavailable". The limit counts every process of that uid,
      so sandboxes running at once share it. Standard modules the code may need
      are imported before the drop (``_PRELOAD``): where the interpreter lives in
      a private directory (``/root/.pyenv``) ``nobody`` cannot read others.
    * **Output** ``RLIMIT_FSIZE`` on stdout/stderr (they go to temp files): a write
      past ``max_output_bytes`` fails (Python ignores SIGXFSZ, so it raises
      ``OSError: File too large``); what we read back is capped too.
    * **Network**: where ``unshare --net`` works (root, or a kernel allowing user
      namespaces; checked once) the child gets a fresh network namespace with no
      interface up, so every connect fails in the kernel, whatever the code does.
      Elsewhere the runner replaces ``socket.socket`` and friends with a function
      that raises: a guard, not a wall (ctypes could get round it); which one is in
      use is ``network_isolation()``.
    """
    limits = limits or SandboxLimits()
    fsize = max(1, int(limits.max_output_bytes))
    guard_net = 0
    prefix: list[str] = []
    if not limits.network:
        if network_isolation() == "netns":
            prefix = [shutil.which("unshare") or "unshare", "--net", "--"]
        else:
            guard_net = 1
    args = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _RUNNER,
        str(max(1, math.ceil(limits.cpu_s))),
        str(int(limits.memory_mb) * 1024 * 1024),
        str(fsize),
        str(max(1, int(limits.max_processes))),
        str(guard_net),
    ]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        process = subprocess.Popen(
            prefix + args,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            start_new_session=True,
            cwd=tempfile.gettempdir(),
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8",
            },
        )
        timed_out = False
        try:
            process.communicate(code.encode("utf-8", "replace"), timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(process.pid)
            process.wait()
        seconds = time.monotonic() - started
        stdout, out_full = _read_capped(out, fsize)
        stderr, err_full = _read_capped(err, fsize)
    code_ = process.returncode
    truncated = out_full or err_full
    if timed_out:
        status = "timeout"
    elif (
        code_ is not None
        and code_ < 0
        and -code_ in (signal.SIGXCPU, signal.SIGKILL)
        and seconds >= limits.cpu_s * 0.5
    ):
        status = "cpu_limit"
    elif "MemoryError" in stderr:
        status = "memory_limit"
    elif truncated or "File too large" in stderr:
        status = "output_limit"
    elif code_ is not None and code_ < 0:
        status = "killed"
    else:
        status = "ok" if code_ == 0 else "error"
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=code_,
        status=status,
        seconds=seconds,
        output_truncated=truncated,
    )


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(handle, limit: int) -> tuple[str, bool]:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(0)
    data = handle.read(limit)
    return data.decode("utf-8", "replace"), size >= limit
