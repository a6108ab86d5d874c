"""The ``local`` workspace runtime: one size-limited directory per episode on this host, commands in the namespace sandbox.

Where Docker is not available (a CI box, a laptop, a VM with root) an agent can still work in a
shell: each workspace is a fresh tmpfs of ``disk_mb`` MiB mounted under ``root``, holding a copy of
the task's files, and every command runs through :func:`roll_async.workspaces.shell.run_shell` with
its own PID, mount and network namespaces. Two uids from the sandbox's pool belong to a workspace:
the agent's, which owns the files while the agent works, and the verifier's (``user="root"``: the
privileged side of the contract, but never the host's root, because the tests import code the agent
wrote); the files change hands when the user does, so nothing the agent left running or wrote can
act as the verifier. It needs root and namespaces; elsewhere it raises ``UnsupportedHostError``
naming ``runtime: docker`` as the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from roll_async.config.field_checks import from_mapping
from roll_async.errors import UnsupportedHostError, WorkspaceError
from roll_async.workspaces.interface import (
    ExecResult,
    RuntimeKind,
    WorkspaceSpec,
    WorkspaceStats,
)
from roll_async.workspaces.pylib import python_tools
from roll_async.workspaces.sandbox import (
    _UID_BASE,
    _UID_POOL,
    _run_uid,
    namespace_problem,
    network_isolation,
    sandbox_uids,
)
from roll_async.workspaces.shell import ShellLimits, run_shell

_FALLBACK = "set runtime: docker to run the agent in containers instead"
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class LocalRuntimeConfig:
    """Where workspaces live and the limits the spec does not carry.

    ``python_packages`` are copied (with their dependencies) where every uid can read them and put on
    ``PYTHONPATH`` (see :mod:`.pylib`), so the host's ``python3`` has them as the task image does.
    """

    root: str = "/var/lib/roll_async/workspaces"
    max_output_bytes: int = 64 * 1024
    file_size_mb: int = 64
    tmp_mb: int = 64
    max_files: int = 16384
    python_packages: tuple[str, ...] = ("pytest",)


def local_config(config: Any) -> LocalRuntimeConfig:
    """A :class:`LocalRuntimeConfig` from None, itself or a mapping; an unknown key names the accepted ones."""
    if isinstance(config, Mapping) and "python_packages" in config:
        config = {**config, "python_packages": tuple(config["python_packages"])}
    runtime: LocalRuntimeConfig = from_mapping(
        LocalRuntimeConfig, config, "runtime_config", "the local runtime"
    )
    return runtime


def host_problem() -> str | None:
    """None when this host can run local workspaces, else what it lacks (one phrase)."""
    problem = namespace_problem()
    if problem is not None:
        return problem
    if (
        network_isolation() != "netns"
    ):  # the runner's socket guard is Python's; a shell needs the kernel's
        return "a network namespace (unshare --net failed)"
    if sandbox_uids() != "per_run":
        return "a pool of sandbox uids (the host's user namespace maps too few uids)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "the mount and umount commands"
    return None


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        return any(line.split()[4] == path for line in mounts)


def _unmount(path: str) -> None:
    if _mounted(path):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)


def pids_of(uid: int) -> list[int]:
    """Processes whose real or effective uid is ``uid`` (read from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        real, effective = (int(x) for x in line.split()[1:3])
                        if uid in (real, effective):
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


def kill_uid(uid: int) -> int:
    """SIGKILL every process of ``uid`` until none is left (a forking one included); the number killed."""
    killed = 0
    for _ in range(50):
        pids = pids_of(uid)
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


def _chown_tree(path: str, uid: int) -> None:
    """Give every entry under ``path`` to ``uid`` without following links."""
    os.lchown(path, uid, uid)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(top, name), uid, uid)


def _parts(relative: str) -> list[str]:
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspaceError(f"path {relative!r} leaves the workspace ('..')")
    return parts


def _open_dir(root_fd: int, parts: list[str], create: bool, uid: int) -> int:
    """A descriptor of the directory ``parts`` under ``root_fd``, never through a link.

    With ``create``, a missing directory is made (owned by ``uid``) and a link or file in its place
    is removed first: a path the agent turned into a link to elsewhere is taken back.
    """
    fd = os.dup(root_fd)
    try:
        for name in parts:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                child = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)
                child = os.open(name, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not create:
                    raise WorkspaceError(f"{name!r} is not a directory: {exc}") from exc
                _remove_at(fd, name)
                os.mkdir(name, 0o755, dir_fd=fd)
                os.chown(name, uid, uid, dir_fd=fd, follow_symlinks=False)
                child = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _remove_at(dir_fd: int, name: str) -> None:
    """Remove the entry ``name`` of a directory: a file, a link or a whole tree (links not followed)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except (IsADirectoryError, PermissionError):
        child = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd
        )
        try:
            for entry in os.listdir(child):
                _remove_at(child, entry)
        finally:
            os.close(child)
        os.rmdir(name, dir_fd=dir_fd)


class LocalWorkspace:
    """One episode's directory and its two uids; see the module docstring."""

    def __init__(
        self,
        spec: WorkspaceSpec,
        config: LocalRuntimeConfig,
        home: str,
        pylib: str,
    ) -> None:
        self.spec = spec
        self.config = config
        self.home = home  # the per-workspace folder under root (root-owned, 0711)
        self.path = os.path.join(home, "ws")  # the tmpfs the agent works in
        self.pylib = pylib
        self._uids = contextlib.ExitStack()
        self.agent_uid = self.verifier_uid = -1
        self.owner = -1
        self.closed = False
        self.stats = WorkspaceStats(pool_hit=False, start_s=0.0)

    def start(self) -> None:
        """Take two uids, mount the tmpfs, copy the task's files in (blocking; the runtime calls it in a thread)."""
        started = time.monotonic()
        for name in ("agent_uid", "verifier_uid"):
            uid = self._uids.enter_context(_run_uid())
            if not _UID_BASE <= uid < _UID_BASE + _UID_POOL:
                raise WorkspaceError(
                    f"no sandbox uid of its own is free for a local workspace (got {uid}); "
                    "close workspaces or lower the number of concurrent episodes"
                )
            setattr(self, name, uid)
        os.makedirs(self.path, mode=0o700)
        spec = self.spec
        options = (
            f"size={max(1, int(spec.disk_mb))}m,nr_inodes={int(self.config.max_files)},"
            f"mode=0700,uid={self.agent_uid},gid={self.agent_uid}"
        )
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"nosuid,nodev,{options}",
                "tmpfs",
                self.path,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise WorkspaceError(
                f"could not mount the workspace tmpfs at {self.path}: {done.stderr.strip()}"
            )
        self.owner = self.agent_uid
        if spec.files is not None:
            self._copy_in(Path(spec.files), "")
        _chown_tree(self.path, self.agent_uid)
        self.stats = WorkspaceStats(pool_hit=False, start_s=time.monotonic() - started)

    # -- paths ---------------------------------------------------------------------------------
    def _relative(self, path: str) -> str:
        """``path`` inside the workspace, relative to its top: absolute under the spec's workdir, or relative."""
        workdir = self.spec.workdir.rstrip("/")
        for prefix in (self.path, workdir):
            if path == prefix:
                return ""
            if path.startswith(prefix + "/"):
                return path[len(prefix) + 1 :]
        if os.path.isabs(path):
            raise WorkspaceError(
                f"path {path!r} is outside the workspace ({workdir} or {self.path})"
            )
        return path

    def _check_open(self) -> None:
        if self.closed:
            raise WorkspaceError(f"workspace {self.path} is closed")

    def _give_to(self, uid: int) -> None:
        if self.owner != uid:
            _chown_tree(self.path, uid)
            self.owner = uid

    # -- the contract --------------------------------------------------------------------------
    async def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        user: Literal["agent", "root"] = "agent",
        workdir: str | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``bash -lc`` in the sandbox as the agent's or the verifier's uid."""
        self._check_open()
        uid = self.agent_uid if user == "agent" else self.verifier_uid
        if user != "agent":
            await asyncio.to_thread(kill_uid, self.agent_uid)
        await asyncio.to_thread(self._give_to, uid)
        where = os.path.join(self.path, *_parts(self._relative(workdir or self.path)))
        env = {
            "PATH": f"{self.pylib}/bin:{_SYSTEM_PATH}",
            "PYTHONPATH": self.pylib,
            "WORKSPACE": self.path,
            **dict(self.spec.env),
        }
        # a login shell resets PATH from /etc/profile: put the python tools back in front
        script = f'PATH="{self.pylib}/bin:$PATH"; export PATH\n{command}'
        limits = ShellLimits(
            timeout_s=max(0.1, float(timeout_s)),
            memory_mb=int(self.spec.memory_mb),
            max_processes=int(self.spec.pids_limit),
            file_size_mb=int(self.config.file_size_mb),
            tmp_mb=int(self.config.tmp_mb),
            max_files=int(self.config.max_files),
            max_output_bytes=int(self.config.max_output_bytes),
            network=bool(self.spec.network),
        )
        result = await asyncio.to_thread(
            run_shell,
            script,
            uid=uid,
            writable=self.path,
            workdir=where,
            env=env,
            limits=limits,
        )
        return ExecResult(
            exit_code=result.exit_code,
            output=result.output,
            timed_out=result.timed_out,
            truncated=result.truncated,
            seconds=result.seconds,
        )

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create or replace a file (links on the way are replaced, never followed); owned by the current user."""
        self._check_open()
        try:
            await asyncio.to_thread(self._write, self._relative(path), data, mode)
        except (
            OSError
        ) as exc:  # a full tmpfs, a name too long: the workspace's state, said as such
            raise WorkspaceError(
                f"cannot write {path!r} in the workspace: {exc}"
            ) from exc

    def _write(self, relative: str, data: bytes, mode: int) -> None:
        parts = _parts(relative)
        if not parts:
            raise WorkspaceError(
                f"cannot write to the workspace directory itself ({relative!r})"
            )
        root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            parent = _open_dir(root, parts[:-1], True, self.owner)
        finally:
            os.close(root)
        try:
            _remove_at(parent, parts[-1])
            fd = os.open(
                parts[-1],
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                mode & 0o777,
                dir_fd=parent,
            )
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchown(fd, self.owner, self.owner)
                os.fchmod(fd, mode & 0o777)
            finally:
                os.close(fd)
        finally:
            os.close(parent)

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20) -> bytes:
        """The first ``max_bytes`` of a file, opened without following links."""
        self._check_open()
        return await asyncio.to_thread(self._read, self._relative(path), max_bytes)

    def _read(self, relative: str, max_bytes: int) -> bytes:
        parts = _parts(relative)
        root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            try:
                parent = _open_dir(root, parts[:-1], False, self.owner)
                try:
                    fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
                finally:
                    os.close(parent)
            except (OSError, IndexError) as exc:
                raise WorkspaceError(
                    f"cannot read {relative!r} in the workspace: {exc}"
                ) from exc
        finally:
            os.close(root)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(max(0, int(max_bytes)))

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host file or directory's contents to ``dest``, link-safely, owned by the current user."""
        self._check_open()
        try:
            await asyncio.to_thread(self._copy_in, Path(source), self._relative(dest))
        except OSError as exc:
            raise WorkspaceError(
                f"cannot copy {source} to {dest!r} in the workspace: {exc}"
            ) from exc

    def _copy_in(self, source: Path, relative: str) -> None:
        if source.is_file():
            self._write(relative, source.read_bytes(), source.stat().st_mode & 0o777)
            return
        if not source.is_dir():
            raise WorkspaceError(
                f"copy_in source {source} is neither a file nor a directory"
            )
        for top, dirs, files in os.walk(source):
            dirs.sort()
            base = os.path.relpath(top, source)
            for name in sorted(files):
                host = Path(top) / name
                if host.is_symlink():
                    continue
                inside = "/".join(
                    p for p in (relative, base, name) if p not in ("", ".")
                )
                self._write(inside, host.read_bytes(), host.stat().st_mode & 0o777)

    async def kill_agent_processes(self) -> None:
        """SIGKILL every process of the agent's uid (its commands' namespaces already end with them)."""
        if self.agent_uid >= 0:
            await asyncio.to_thread(kill_uid, self.agent_uid)

    async def close(self) -> None:
        """Kill both uids' processes, unmount and remove the directory, give the uids back; safe twice."""
        if self.closed:
            return
        self.closed = True
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        for uid in (self.agent_uid, self.verifier_uid):
            if uid >= 0:
                kill_uid(uid)
        _unmount(self.path)
        shutil.rmtree(self.home, ignore_errors=True)
        self._uids.close()


@dataclass
class LocalRuntime:
    """Starts :class:`LocalWorkspace` s under ``config.root``; removes dead runs' workspaces when it starts."""

    config: LocalRuntimeConfig = field(default_factory=LocalRuntimeConfig)
    kind: RuntimeKind = field(default="local", init=False)

    def __post_init__(self) -> None:
        self.config = local_config(self.config)
        problem = host_problem()
        if problem is not None:
            raise UnsupportedHostError(f"runtime: local needs {problem}; {_FALLBACK}")
        self._held: list[LocalWorkspace] = []
        os.makedirs(self.config.root, mode=0o711, exist_ok=True)
        os.chmod(self.config.root, 0o711)
        self._sweep()
        self.pylib = python_tools(self.config.root, self.config.python_packages)

    def _sweep(self) -> None:
        """Remove the workspaces of runs whose process is gone (their folder names start with its pid)."""
        for entry in os.listdir(self.config.root):
            pid, _, _ = entry.partition("-")
            if not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            home = os.path.join(self.config.root, entry)
            _unmount(os.path.join(home, "ws"))
            shutil.rmtree(home, ignore_errors=True)

    async def start(self, spec: WorkspaceSpec) -> LocalWorkspace:
        """A fresh workspace with ``spec.files`` copied in (``spec.image`` and ``dockerfile`` are not used here)."""
        home = os.path.join(self.config.root, f"{os.getpid()}-{secrets.token_hex(6)}")
        os.makedirs(home, mode=0o711)
        os.chmod(home, 0o711)
        workspace = LocalWorkspace(spec, self.config, home, self.pylib)
        try:
            await asyncio.to_thread(workspace.start)
        except BaseException:
            await workspace.close()
            raise
        # a shared runtime serves many episodes: forget the closed workspaces as new ones come
        self._held = [held for held in self._held if not held.closed]
        self._held.append(workspace)
        return workspace

    def alive(self) -> int:
        """Workspaces started and not closed yet."""
        return sum(not held.closed for held in self._held)

    async def shutdown(self) -> None:
        """Close every workspace still held; safe twice."""
        held, self._held = self._held, []
        for workspace in held:
            await workspace.close()
