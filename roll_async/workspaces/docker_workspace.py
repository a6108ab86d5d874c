"""One episode's container: commands through exec, files through the archive API, death as WorkspaceError.

Every Engine API call runs on the runtime's thread pool (the ``docker`` package blocks). Commands run
as the unprivileged agent user (or root, for the verifier) under the deadline and cap of
:mod:`.docker_exec`; files go in with ``put_archive`` and come out with ``get_archive``, owned by the
agent inside the workdir so the agent can edit what the task gave it. A container that died (killed,
its init OOM-killed, removed behind our back) or a daemon that stops answering turns into
:class:`WorkspaceError` naming the container and what happened, and the container is removed on the
spot: the env records the episode as an env error and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import io
import logging
import posixpath
import shlex
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal, TypeVar

from roll_async.errors import WorkspaceError
from roll_async.workspaces.docker_exec import (
    KILLED,
    MARKER_VAR,
    kill_marked,
    run_exec,
    wrapped,
)
from roll_async.workspaces.docker_reaper import remove_container
from roll_async.workspaces.interface import ExecResult, WorkspaceSpec, WorkspaceStats

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: How often (0.1 s apart) a command killed before its timeout checks whether its container died.
_DEATH_CHECKS = 5
#: A Go os.FileMode's directory bit, as get_archive's stat header reports it.
_GO_DIR_BIT = 1 << 31


class DockerWorkspace:
    """A started container bound to one episode; see the module docstring."""

    def __init__(
        self,
        api: Any,
        container_id: str,
        spec: WorkspaceSpec,
        *,
        agent_user: str,
        output_cap: int,
        grace_s: float,
        executor: Executor,
        on_close: Callable[[str], None],
        stats: WorkspaceStats,
    ) -> None:
        self.container_id = container_id
        self.spec = spec
        self.stats = stats
        self._api = api
        self._agent_user = agent_user
        self._agent_owner = tuple(int(part) for part in agent_user.split(":"))
        #: Who owns the workdir now: the agent, or root from the first root command on (the verifier)
        self._files_owner: Literal["agent", "root"] = "agent"
        self._output_cap = output_cap
        self._grace_s = grace_s
        self._executor = executor
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether the workspace was closed or its container died (every method then raises)."""
        return self._closed

    # -- the Workspace protocol ------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        user: Literal["agent", "root"] = "agent",
        workdir: str | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``bash -lc`` in ``workdir`` (default: the spec's) as the agent or as root."""
        folder = self._absolute(workdir) if workdir else self.spec.workdir
        return await self._run(lambda: self._exec(command, timeout_s, user, folder))

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create or replace the file at ``path`` (absolute, or relative to the workdir) as root."""
        target = self._absolute(path)
        folder, name = posixpath.split(target)
        owner = self._owner(target)
        await self._run(
            lambda: self._put(folder, lambda at: _tar([(name, data, mode)], owner, at))
        )

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20) -> bytes:
        """The first ``max_bytes`` of the regular file at ``path``; ``WorkspaceError`` when it does not exist
        or is a link (a link the agent planted is not followed, as the local runtime does not)."""
        return await self._run(lambda: self._get(self._absolute(path), max_bytes))

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host directory's contents (or one file) to ``dest`` inside the workspace, as root.

        A directory's contents land inside ``dest``; one file lands at ``dest`` itself, or inside it when
        ``dest`` ends with ``/``.
        """
        source = Path(source)
        target = self._absolute(dest)
        if source.is_file() and dest.endswith("/"):
            target = posixpath.join(target, source.name)
        if not source.exists():
            raise WorkspaceError(
                f"copy_in: {source} does not exist on the host: fix the task's files path"
            )
        await self._run(lambda: self._copy_in(source, target))

    async def kill_agent_processes(self) -> None:
        """Kill every process the agent user started (before the verifier runs)."""
        await self._run(self._kill_agent)

    async def close(self) -> None:
        """Remove the container and its volumes; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._on_close(self.container_id)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._remove)
        except Exception as exc:
            raise WorkspaceError(
                f"container {self.container_id[:12]} could not be removed ({type(exc).__name__}: "
                f"{exc}); the runtime's shutdown or the next run's reaper removes it"
            ) from exc

    # -- blocking parts, on the executor ---------------------------------------------------------------

    async def _run(self, call: Callable[[], T]) -> T:
        if self._closed:
            raise WorkspaceError(
                f"container {self.container_id[:12]}: the workspace is closed; start a new one"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guarded, call)

    def _guarded(self, call: Callable[[], T]) -> T:
        """``call``, with Docker and connection errors turned into WorkspaceError (and the container removed)."""
        import docker.errors

        try:
            return call()
        except WorkspaceError:
            raise
        except docker.errors.NotFound as exc:
            raise self._dead(f"is gone ({exc.explanation or exc})") from exc
        except docker.errors.APIError as exc:
            state = self._state()
            if state is not None:
                raise self._dead(state) from exc
            raise WorkspaceError(
                f"container {self.container_id[:12]}: the Docker daemon refused a call: "
                f"{exc.explanation or exc}"
            ) from exc
        except OSError as exc:
            # requests' connection errors and read timeouts are OSErrors too
            raise self._dead(
                f"stopped answering ({type(exc).__name__}: {exc}); is the Docker daemon up?"
            ) from exc

    def _state(self) -> str | None:
        """Why the container is not running (exited, OOM-killed, gone), or None when it runs."""
        import docker.errors

        try:
            state = self._api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return "is gone (removed)"
        if state.get("Paused"):
            return "is paused (frozen: it cannot answer)"
        if state.get("Running"):
            return None
        why = (
            "its memory limit was hit"
            if state.get("OOMKilled")
            else "it was killed or exited"
        )
        return f"{state.get('Status')} with exit code {state.get('ExitCode')} ({why})"

    def _dead(self, what: str) -> WorkspaceError:
        self._closed = True
        self._on_close(self.container_id)
        try:
            self._remove()
        except Exception as exc:
            # a daemon that stopped answering: the reapers remove it later
            logger.warning("could not remove container %s: %s", self.container_id, exc)
        return WorkspaceError(
            f"container {self.container_id[:12]} ({self.spec.image}) {what}: the episode's workspace is "
            "lost and the container removed; the env records an env error"
        )

    def _remove(self) -> None:
        remove_container(self._api, self.container_id)

    def _environment(self, marker: str) -> dict[str, str]:
        env = {"HOME": "/tmp", **dict(self.spec.env)}
        env[MARKER_VAR] = marker
        return env

    def _exec(
        self,
        command: str,
        timeout_s: float,
        user: Literal["agent", "root"],
        workdir: str,
    ) -> ExecResult:
        if user == "root" and self._files_owner == "agent":
            # taken in the root command itself (one exec less for the verifier); it cannot run without them
            command = f"chown -R -h 0:0 -- {shlex.quote(self.spec.workdir)} || exit 125\n{command}"
            self._files_owner = "root"
        else:
            self._give_files_to(user)
        marker = uuid.uuid4().hex
        raw = run_exec(
            self._api,
            self.container_id,
            wrapped(command, timeout_s),
            user=self._agent_user if user == "agent" else "0:0",
            workdir=workdir,
            environment=self._environment(marker),
            deadline_s=timeout_s + self._grace_s,
            cap=self._output_cap,
        )
        if raw.deadline_hit:
            # a process outside timeout's group kept the output open: kill everything the command started
            self._plain(kill_marked(marker), "0:0")
        timed_out = raw.deadline_hit or (
            raw.exit_status == KILLED and raw.seconds >= timeout_s
        )
        if raw.exit_status is None or raw.exit_status == KILLED:
            # killed before its timeout: by the OOM killer, or with the whole container; the daemon
            # notes a container's death a moment after its processes die, so look again briefly
            for _ in range(1 if timed_out else _DEATH_CHECKS):
                state = self._state()
                if state is not None:
                    raise self._dead(state)
                if not timed_out:
                    time.sleep(0.1)
        exit_code = None if raw.exit_status in (None, KILLED) else raw.exit_status
        return ExecResult(
            exit_code=exit_code,
            output=raw.output,
            timed_out=timed_out,
            truncated=raw.truncated,
            seconds=raw.seconds,
        )

    def _give_files_to(self, user: Literal["agent", "root"]) -> None:
        """The workdir changes hands with the user, as in the local runtime: root commands (the verifier)
        own what they run on, and the agent's next command gets it back."""
        if user == self._files_owner:
            return
        owner = self._agent_user if user == "agent" else "0:0"
        status = self._plain(
            ["chown", "-R", "-h", owner, "--", self.spec.workdir], "0:0"
        )
        if status != 0:
            raise WorkspaceError(
                f"container {self.container_id[:12]}: could not give {self.spec.workdir} to {user} "
                f"(chown exit {status}); close the workspace"
            )
        self._files_owner = user

    def _kill_agent(self) -> None:
        # kill(-1) as the agent reaches every process of that uid but the caller itself; twice, for a child
        # forked while the first pass ran. A fork bomb may hold every process slot, so the exec itself
        # may not start: retry while the dying processes free slots.
        import docker.errors

        script = "kill -9 -1 2>/dev/null; sleep 0.05; kill -9 -1 2>/dev/null; true"
        for attempt in range(10):
            try:
                if self._plain(["sh", "-c", script], self._agent_user) == 0:
                    return
            except docker.errors.APIError:
                if self._state() is not None:
                    raise
            time.sleep(0.1 * (attempt + 1))
        raise WorkspaceError(
            f"container {self.container_id[:12]}: the agent's processes could not be killed (no process "
            "slot came free for the kill); close the workspace"
        )

    def _plain(self, argv: list[str], user: str) -> int | None:
        """Run a short runtime command (no bash -l, no timeout wrapper) and return its exit status."""
        raw = run_exec(
            self._api,
            self.container_id,
            argv,
            user=user,
            workdir="/",
            environment={},
            deadline_s=self._grace_s + 25.0,
            cap=4096,
        )
        if raw.deadline_hit:
            raise self._dead(
                "did not finish a runtime command in time (it stopped answering)"
            )
        return raw.exit_status

    def _copy_in(self, source: Path, target: str) -> None:
        """Tar ``source`` (here, off the event loop: a repository may be large) and put it at ``target``."""
        owner = self._owner(target)
        if source.is_dir():
            self._put(target, lambda at: _tar_folder(source, owner, at))
            return
        folder, name = posixpath.split(target)
        entry = (name, source.read_bytes(), source.stat().st_mode & 0o777)
        self._put(folder, lambda at: _tar([entry], owner, at))

    def _put(self, folder: str, archive_at: Callable[[str], bytes]) -> None:
        """Extract the archive ``archive_at(prefix)`` builds into ``folder``.

        The archive API resolves links inside the container, so a folder under the workdir that the agent
        replaced by a link would send the files elsewhere: such a folder goes in as the archive's own
        entries, rooted at the workdir, and extracting an entry replaces whatever is in its place that is
        not a directory (a link, a file). A folder outside the workdir is made when missing.
        """
        import docker.errors

        workdir = posixpath.normpath(self.spec.workdir)
        if folder != workdir and posixpath.commonpath([workdir, folder]) == workdir:
            prefix = posixpath.relpath(folder, workdir)
            self._api.put_archive(self.container_id, workdir, archive_at(prefix))
            return
        archive = archive_at("")
        try:
            self._api.put_archive(self.container_id, folder, archive)
            return
        except docker.errors.NotFound:
            state = self._state()
            if state is not None:
                raise self._dead(state) from None
        owner = ":".join(str(part) for part in self._owner(folder))
        status = self._plain(
            ["sh", "-c", 'mkdir -p -- "$1" && chown "$2" -- "$1"', "sh", folder, owner],
            "0:0",
        )
        if status != 0:
            raise WorkspaceError(
                f"container {self.container_id[:12]}: cannot create {folder} (exit {status}); "
                "copy into the workdir or another writable path"
            )
        self._api.put_archive(self.container_id, folder, archive)

    def _get(self, path: str, max_bytes: int) -> bytes:
        import docker.errors

        try:
            stream, stat = self._api.get_archive(
                self.container_id, path, chunk_size=1 << 16
            )
        except docker.errors.NotFound as exc:
            state = self._state()
            if state is not None:
                raise self._dead(state) from exc
            raise WorkspaceError(
                f"read_file: {path} does not exist in container {self.container_id[:12]}"
            ) from exc
        try:
            if int(stat.get("mode", 0)) & _GO_DIR_BIT:
                raise WorkspaceError(f"read_file: {path} is a directory, not a file")
            with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:
                member = archive.next()
                if member is None:
                    raise WorkspaceError(
                        f"read_file: the archive of {path} held no file"
                    )
                handle = archive.extractfile(member) if member.isfile() else None
                if handle is None:
                    # get_archive sends a link itself: the agent may have planted it, so it is not followed
                    raise WorkspaceError(
                        f"read_file: {path} is not a regular file (a link or a device)"
                    )
                return handle.read(max_bytes)
        finally:
            # closing the generator closes its HTTP response: a large file is not read to its end
            stream.close()

    # -- paths -----------------------------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        """``path`` in the container: absolute as given, or relative to the workdir and not leaving it."""
        joined = posixpath.normpath(posixpath.join(self.spec.workdir, path))
        workdir = posixpath.normpath(self.spec.workdir)
        if (
            not posixpath.isabs(path)
            and posixpath.commonpath([workdir, joined]) != workdir
        ):
            raise WorkspaceError(
                f"path {path!r} leaves the workspace ('..'); give a path inside {workdir}"
            )
        return joined

    def _owner(self, path: str) -> tuple[int, ...]:
        inside = posixpath.commonpath([self.spec.workdir, path]) == self.spec.workdir
        return self._agent_owner if inside and self._files_owner == "agent" else (0, 0)


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (get_archive's stream), for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def _folders(archive: tarfile.TarFile, prefix: str, owner: tuple[int, ...]) -> None:
    """A directory entry for every folder of ``prefix`` (``a/b``: ``a``, ``a/b``), outermost first."""
    parts = [p for p in prefix.split("/") if p not in ("", ".")]
    for depth in range(1, len(parts) + 1):
        info = tarfile.TarInfo("/".join(parts[:depth]))
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        info.uid, info.gid = owner[0], owner[1]
        archive.addfile(info)


def _tar(
    files: list[tuple[str, bytes, int]], owner: tuple[int, ...], prefix: str = ""
) -> bytes:
    """An in-memory tar of (name, bytes, mode) entries under ``prefix`` (its folders as entries too),
    owned by ``owner`` (uid, gid)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        _folders(archive, prefix, owner)
        for name, data, mode in files:
            info = tarfile.TarInfo(posixpath.join(prefix, name) if prefix else name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            info.uid, info.gid = owner[0], owner[1]
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _tar_folder(source: Path, owner: tuple[int, ...], prefix: str = "") -> bytes:
    """An in-memory tar of ``source``'s contents (paths relative to it, under ``prefix`` whose folders are
    entries too) owned by ``owner``."""

    def own(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid, info.uname, info.gname = owner[0], owner[1], "", ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        _folders(archive, prefix, owner)
        for child in sorted(source.iterdir()):
            name = posixpath.join(prefix, child.name) if prefix else child.name
            archive.add(child, arcname=name, filter=own)
    return buffer.getvalue()
