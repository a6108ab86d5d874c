"""Run untrusted Python in a child process with CPU-time, memory, process, output, file and network limits.

Code written by a model may loop, allocate without bound, fork, flood its
output, fill the disk, leave files for the next episode or reach the network;
the code env and its grader run it here so none of that can touch the host or
another run, and the whole process group is killed before a call returns.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
cpu_s, memory, fsize, nproc, guard_net, tmpfs_bytes, tmpfs_files = (int(x) for x in sys.argv[1:8])
if tmpfs_bytes:
    # In our own mount namespace (unshare --mount, as root): every mount read-only, then one size-limited
    # tmpfs on /tmp, also bound on /var/tmp and /dev/shm: the only writable place, gone when the run ends.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    def _mount(source, target, fstype, flags, data):
        if libc.mount(source, target.encode(), fstype, flags, data) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), target)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
        1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    for point in points:
        if "\\" in point:  # octal-escaped names: not a place the runner needs
            continue
        try:
            kept = os.statvfs(point).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None)
        except OSError:
            if point == "/":
                raise
    _mount(b"tmpfs", "/tmp", b"tmpfs", MS_NOSUID | MS_NODEV,
           b"size=%%d,nr_inodes=%%d,mode=1777" %% (tmpfs_bytes, tmpfs_files))
    for point in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(point):
            _mount(b"/tmp", point, None, MS_BIND, None)
    os.chdir("/tmp")
    del ctypes, libc, _mount, points
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
del os, resource, fd, cpu_s, memory, fsize, nproc, guard_net, tmpfs_bytes, tmpfs_files
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
    #: The program's private writable space (/tmp, /var/tmp, /dev/shm, HOME and TMPDIR all in it), in MiB.
    disk_mb: int = 16
    #: Most files and directories the program may create there.
    max_files: int = 4096


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


@functools.lru_cache(maxsize=1)
def file_isolation() -> str:
    """``tmpfs`` when a private mount namespace works here (root and ``unshare --mount``), else ``temp_dir``.

    Checked once by running the real set-up (read-only mounts, a private tmpfs) on a program that does nothing.
    """
    unshare = shutil.which("unshare")
    if unshare is None or os.getuid() != 0:
        return "temp_dir"
    try:
        done = subprocess.run(
            [unshare, "--mount", "--", *_runner_args(SandboxLimits(), 1, 1, 1 << 20)],
            input=b"pass",
            capture_output=True,
            timeout=30,
            start_new_session=True,
        )
        ok = done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return "tmpfs" if ok else "temp_dir"


def _runner_args(
    limits: SandboxLimits, fsize: int, guard_net: int, tmpfs_bytes: int
) -> list[str]:
    return [
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
        str(tmpfs_bytes),
        str(max(16, int(limits.max_files))),
    ]


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
    * **Files**: where a private mount namespace works (``file_isolation()`` is
      ``tmpfs``: root, ``unshare --mount``; checked once) the runner makes every
      mount read-only and mounts one tmpfs of ``disk_mb`` MiB and ``max_files``
      inodes on /tmp, bound on /var/tmp and /dev/shm too, with HOME, TMPDIR and the
      working directory in it: the program's only writable place, private to the
      run and gone with it, so one episode cannot leave data for another or fill
      the disk. Elsewhere (``temp_dir``) HOME, TMPDIR and the working directory are
      a fresh temp directory deleted after the run, and ``RLIMIT_FSIZE`` bounds each
      file; a program that writes to /tmp by name can still leave files there.
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
    namespaces: list[str] = []
    if not limits.network:
        if network_isolation() == "netns":
            namespaces.append("--net")
        else:
            guard_net = 1
    tmpfs = file_isolation() == "tmpfs"
    if tmpfs:
        namespaces.append("--mount")
    prefix = (
        [shutil.which("unshare") or "unshare", *namespaces, "--"] if namespaces else []
    )
    args = _runner_args(
        limits,
        fsize,
        guard_net,
        max(1, int(limits.disk_mb)) * 1024 * 1024 if tmpfs else 0,
    )
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        _private_dir(tmpfs) as home,
    ):
        started = time.monotonic()
        process = subprocess.Popen(
            prefix + args,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            start_new_session=True,
            cwd=home,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8",
                "HOME": home,
                "TMPDIR": home,
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


@contextlib.contextmanager
def _private_dir(tmpfs: bool) -> Iterator[str]:
    """The program's HOME/TMPDIR/working directory: /tmp of its own tmpfs, else a temp dir deleted afterwards."""
    if tmpfs:
        yield "/tmp"  # the runner mounts the private tmpfs there and moves into it
        return
    path = tempfile.mkdtemp(prefix="roll_async_sandbox_")
    try:
        os.chmod(path, 0o777)  # the runner may drop to nobody
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
