"""Run untrusted Python in a child process with CPU-time, memory, process, output, file and network limits.

Code written by a model may loop, allocate without bound, fork, flood its
output, fill the disk, leave files for the next episode or reach the network;
the code env and its grader run it here so none of that can touch the host or
another run. Where PID namespaces work, nothing the program started outlives the
call; elsewhere its process group is killed before the call returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from roll_async.errors import ConfigError, UnsupportedHostError
from roll_async.workspaces.supervisor import exit_of, read_status, run_supervised

_NOBODY = 65534
#: Per-run uids (root only): _UID_BASE + slot, slot < _UID_POOL, far above any login or container uid.
_UID_BASE = 1_600_000_000
_UID_POOL = 4096
#: Lock files of the uid slots, one path for every process on the host (root-owned, mode 0700: no
#: sandboxed program can reach them).
_UID_LOCKS = "/tmp/roll_async_sandbox_uids"
ISOLATION_MODES = ("auto", "namespaces", "rlimits")
#: Imported before dropping to ``nobody``: an interpreter under a private directory (e.g. /root/.pyenv)
#: cannot be read afterwards, so these are the modules such code can use there.
_PRELOAD = (
    "abc array bisect collections copy dataclasses datetime decimal enum fractions functools heapq itertools json "
    "math operator random re signal socket statistics string textwrap threading time typing unicodedata encodings.idna"
).split()

_RUNNER = r"""
import os, resource, sys, time
source = sys.stdin.buffer.read().decode("utf-8", "replace")
fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
cpu_s, memory, fsize, nproc, guard_net, tmpfs_bytes, tmpfs_files, uid, status_fd, pidns = (
    int(x) for x in sys.argv[1:11])
deadline = float(sys.argv[11])
writable, workdir = sys.argv[12], sys.argv[13]  # a shell run's workspace: left writable, its cwd
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
    if pidns:
        # /proc of this PID namespace: only this run's processes, and not the supervisor (hidepid)
        _mount(b"proc", "/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2")
    if writable:  # bound on itself, then that one mount made writable again (nosuid, nodev)
        _mount(writable.encode(), writable, None, MS_BIND, None)
        _mount(None, writable, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, None)
    os.chdir(workdir or "/tmp")
    del ctypes, libc, _mount, points
if os.getuid() == 0:
    for name in %(preload)r:
        try:
            __import__(name)
        except ImportError:
            pass
child = os.fork()
if child:
    # The supervisor: never runs the program's code. In a PID namespace it is PID 1, so its exit tears
    # down every process of the run; it keeps root (the program cannot signal or trace it) and reports
    # how the program ended on status_fd, which the program does not hold.
    import select
    def _report(text):
        os.write(status_fd, text.encode())
        os._exit(0)
    try:
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):  # before Linux 5.3: poll
        pidfd = -1
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            if not pidns:
                os.kill(child, 9)
            _report("timeout")
        if pidfd >= 0:
            select.select([pidfd], [], [], left)
        else:
            time.sleep(min(left, 0.01))
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
    _report("signal %%d" %% os.WTERMSIG(status) if os.WIFSIGNALED(status)
            else "exit %%d" %% os.WEXITSTATUS(status))
os.close(status_fd)
if pidns:
    os.setsid()  # its own group and session inside the namespace: kill(0, ...) reaches only the run
if os.getuid() == 0 and uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
os.umask(0o077)  # what it writes outside its private place is readable by its own uid only
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
del os, resource, time, fd, cpu_s, memory, fsize, nproc, guard_net, tmpfs_bytes, tmpfs_files, uid, status_fd
del pidns, deadline, child
sys.argv = ["solution.py"]
exec(compile(source, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
""" % {"preload": _PRELOAD}  # noqa: UP031 (a %-template keeps the braces of the code it holds)


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
    #: ``namespaces``: a PID namespace per run, refused (UnsupportedHostError) where it cannot be set up;
    #: ``rlimits``: process group and rlimits only; ``auto``: namespaces where they work.
    sandbox_isolation: str = "auto"


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
def sandbox_uids() -> str:
    """``per_run`` (root, each run its own uid from a pool), ``nobody`` (root, one shared uid) or ``caller``.

    Checked once by running a program as the first uid of the pool: a host whose user namespace maps
    few uids (rootless containers) cannot use the pool and shares ``nobody``.
    """
    if os.getuid() != 0:
        return "caller"
    return "per_run" if _probe(_UID_BASE, pidns=False, tmpfs=False) else "nobody"


@functools.lru_cache(maxsize=1)
def file_isolation() -> str:
    """``tmpfs`` when a private mount namespace works here (root and ``unshare --mount``), else ``temp_dir``.

    Checked once by running the real set-up (read-only mounts, a private tmpfs) on a program that does nothing.
    """
    if shutil.which("unshare") is None or os.getuid() != 0:
        return "temp_dir"
    return "tmpfs" if _probe(_NOBODY, pidns=False, tmpfs=True) else "temp_dir"


@functools.lru_cache(maxsize=1)
def namespace_problem() -> str | None:
    """None when every run can get its own PID namespace here, else what is missing (a short phrase).

    Checked once by running the real set-up (``unshare --pid --fork --kill-child --mount``, a private
    /proc and tmpfs, the uid drop) on a program that does nothing.
    """
    if os.getuid() != 0:
        return (
            f"root (running as uid {os.getuid()}; the PID and mount namespaces need it)"
        )
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux)"
    if file_isolation() != "tmpfs":
        return "a private mount namespace (unshare --mount failed)"
    if not _probe(_NOBODY, pidns=True, tmpfs=True):
        return "a PID namespace (unshare --pid --fork --kill-child failed)"
    return None


def process_isolation(mode: str = "auto") -> str:
    """``pidns`` or ``process_group``: what ``run_python`` uses for ``sandbox_isolation=mode``.

    ``namespaces`` raises ``UnsupportedHostError`` (one line: what is missing) where a PID namespace cannot be
    set up, rather than running with less isolation than asked for.
    """
    if mode not in ISOLATION_MODES:
        raise ConfigError(
            f"sandbox_isolation={mode!r} is not one of {list(ISOLATION_MODES)}"
        )
    if mode == "rlimits":
        return "process_group"
    problem = namespace_problem()
    if problem is None:
        return "pidns"
    if mode == "namespaces":
        raise UnsupportedHostError(
            f"sandbox_isolation=namespaces needs {problem}; "
            "set sandbox_isolation: rlimits to accept process-group isolation"
        )
    return "process_group"


def _probe(uid: int, pidns: bool, tmpfs: bool) -> bool:
    """Whether the runner's set-up works here, run on a program that does nothing."""
    read, write = os.pipe()
    try:
        done = subprocess.run(
            _command(
                SandboxLimits(),
                uid=uid,
                status_fd=write,
                guard_net=1,
                tmpfs_bytes=1 << 20 if tmpfs else 0,
                pidns=pidns,
                deadline=time.monotonic() + 30,
            ),
            input=b"pass",
            capture_output=True,
            timeout=30,
            start_new_session=True,
            pass_fds=(write,),
        )
        os.close(write)
        write = -1
        return done.returncode == 0 and read_status(read) == "exit 0"
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def _command(
    limits: SandboxLimits,
    *,
    uid: int,
    status_fd: int,
    guard_net: int,
    tmpfs_bytes: int,
    pidns: bool,
    deadline: float,
    writable: str = "",
    workdir: str = "",
) -> list[str]:
    namespaces = ["--pid", "--fork", "--kill-child"] if pidns else []
    if tmpfs_bytes:
        namespaces.append("--mount")
    if not guard_net and not limits.network:
        namespaces.append("--net")
    prefix = (
        [shutil.which("unshare") or "unshare", *namespaces, "--"] if namespaces else []
    )
    return [
        *prefix,
        sys.executable,
        "-I",
        "-S",
        "-c",
        _RUNNER,
        str(max(1, math.ceil(limits.cpu_s))),
        str(int(limits.memory_mb) * 1024 * 1024),
        str(max(1, int(limits.max_output_bytes))),
        str(max(1, int(limits.max_processes))),
        str(guard_net),
        str(tmpfs_bytes),
        str(max(16, int(limits.max_files))),
        str(uid),
        str(status_fd),
        str(int(pidns)),
        repr(deadline),
        writable,
        workdir,
    ]


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` under ``limits``; never raises for anything the code does.

    ``run_python(code, limits)`` starts ``python -I -S`` (isolated, no site
    packages) in a new session. That runner sets up the run, then forks: the
    child sets its own rlimits and runs the code (no ``preexec_fn``, which is
    unsafe in threaded processes such as a Ray worker); the parent, the
    *supervisor*, runs no code of the program, enforces the wall clock and
    reports how the child ended on a pipe the program does not hold.

    * **Isolation** (``sandbox_isolation``; ``process_isolation()`` says which):
      ``pidns`` (``namespaces``, the default where it works: root and
      ``unshare --pid --fork --kill-child``; checked once): the run gets its own
      PID namespace with its own /proc, and the supervisor is its PID 1. The
      program sees and can signal only its own run's processes (``kill(-1, 9)``
      reaches nothing outside it; PID 1 is root and immune), and when PID 1
      exits the kernel kills every process left in the namespace, a double fork
      plus ``setsid()`` included, before this call returns. ``process_group``
      (``rlimits``, or ``auto`` where namespaces are missing): the whole process
      group is killed when the call ends; a process that calls ``setsid()``
      leaves the group and can outlive the call, and, without a uid of its own,
      can signal other runs. ``sandbox_isolation=namespaces`` where namespaces
      are missing raises ``UnsupportedHostError`` rather than weaken silently.
    * **Uid**: as root, each run drops to a uid of its own (``sandbox_uids()`` is
      ``per_run``: ``_UID_BASE`` + a slot held with a file lock while the run
      lasts, so concurrent runs, in any process on the host, never share one);
      where the host cannot use the pool, ``nobody`` (65534) shared by all runs.
      Standard modules the code may need are imported before the drop
      (``_PRELOAD``): where the interpreter lives in a private directory
      (``/root/.pyenv``) the run's uid cannot read others. Not root: the caller's uid.
    * **CPU time** ``RLIMIT_CPU``: past it the kernel sends SIGXCPU (SIGKILL at one
      second more); the wall clock (``wall_s``, measured from the call) ends the
      run for code that sleeps or blocks.
    * **Memory** ``RLIMIT_AS``: an allocation past it raises MemoryError.
    * **Processes** ``RLIMIT_NPROC``: the limit counts every process of a uid, so
      with ``per_run`` uids a fork bomb in one run cannot make another run's forks
      fail (with ``nobody`` runs share it); a fork bomb then fails with
      "Resource temporarily unavailable".
    * **Output** ``RLIMIT_FSIZE`` on stdout/stderr (they go to temp files): a write
      past ``max_output_bytes`` fails (Python ignores SIGXFSZ, so it raises
      ``OSError: File too large``); what we read back is capped too.
    * **Files**: where a private mount namespace works (``file_isolation()`` is
      ``tmpfs``: root, ``unshare --mount``; checked once) the runner makes every
      mount read-only and mounts one tmpfs of ``disk_mb`` MiB and ``max_files``
      inodes on /tmp, bound on /var/tmp and /dev/shm too, with HOME, TMPDIR and the
      working directory in it: the program's only writable place, private to the
      run and gone with it, so one episode cannot read or leave data for another
      or fill the disk. Elsewhere (``temp_dir``) HOME, TMPDIR and the working
      directory are a fresh temp directory deleted after the run (mode 0700, owned
      by the run's uid when it has one of its own), and ``RLIMIT_FSIZE`` bounds
      each file; a program that writes to /tmp by name can still leave files there
      (created with umask 077: with a uid of its own, no other run can read them).
    * **Network**: where ``unshare --net`` works (root, or a kernel allowing user
      namespaces; checked once) the child gets a fresh network namespace with no
      interface up, so every connect fails in the kernel, whatever the code does.
      Elsewhere the runner replaces ``socket.socket`` and friends with a function
      that raises: a guard, not a wall (ctypes could get round it); which one is in
      use is ``network_isolation()``.
    """
    limits = limits or SandboxLimits()
    pidns = process_isolation(limits.sandbox_isolation) == "pidns"
    guard_net = int(not limits.network and network_isolation() != "netns")
    tmpfs = file_isolation() == "tmpfs"
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        _run_uid() as uid,
        _private_dir(tmpfs, uid) as home,
    ):
        started = time.monotonic()
        returncode, report, backstop = run_supervised(
            lambda status_fd: _command(
                limits,
                uid=uid,
                status_fd=status_fd,
                guard_net=guard_net,
                tmpfs_bytes=max(1, int(limits.disk_mb)) * 1024 * 1024 if tmpfs else 0,
                pidns=pidns,
                deadline=started + float(limits.wall_s),
            ),
            stdin=code.encode("utf-8", "replace"),
            stdout=out,
            stderr=err,
            cwd=home,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8",
                "HOME": home,
                "TMPDIR": home,
            },
            wall_s=float(limits.wall_s),
        )
        seconds = time.monotonic() - started
        stdout, out_full = _read_capped(out, limits.max_output_bytes)
        stderr, err_full = _read_capped(err, limits.max_output_bytes)
    code_, timed_out = exit_of(report, returncode, backstop)
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
def _run_uid() -> Iterator[int]:
    """The uid this run drops to (-1: no drop), held for the run with a file lock so no concurrent run shares it."""
    kind = sandbox_uids()
    if kind != "per_run":
        yield _NOBODY if kind == "nobody" else -1
        return
    os.makedirs(_UID_LOCKS, mode=0o700, exist_ok=True)
    info = os.lstat(_UID_LOCKS)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o077:
        yield _NOBODY  # someone else made that directory: its locks cannot be trusted
        return
    start = secrets.randbelow(_UID_POOL)
    for i in range(_UID_POOL):
        slot = (start + i) % _UID_POOL
        handle = open(os.path.join(_UID_LOCKS, str(slot)), "a")  # noqa: SIM115 (held for the run)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            yield _UID_BASE + slot
        finally:
            handle.close()  # releases the lock
        return
    yield _NOBODY  # every slot in use at once: share nobody rather than fail the run


@contextlib.contextmanager
def _private_dir(tmpfs: bool, uid: int) -> Iterator[str]:
    """The program's HOME/TMPDIR/working directory: /tmp of its own tmpfs, else a temp dir deleted afterwards."""
    if tmpfs:
        yield "/tmp"  # the runner mounts the private tmpfs there and moves into it
        return
    path = tempfile.mkdtemp(prefix="roll_async_sandbox_")
    try:
        if uid >= 0:
            os.chown(
                path, uid, uid
            )  # only this run's uid can enter it (mkdtemp made it 0700)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _read_capped(handle: IO[bytes], limit: int) -> tuple[str, bool]:
    limit = max(1, int(limit))
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(0)
    data = handle.read(limit)
    return data.decode("utf-8", "replace"), size >= limit
