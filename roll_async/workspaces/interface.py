"""The contract between an env that runs an agent in a shell and the runtime that provides the shell.

One :class:`Workspace` per episode: a writable working directory inside an isolated system where
commands run with a per-command timeout and an output cap. A :class:`WorkspaceRuntime` starts
workspaces from a :class:`WorkspaceSpec` (an image or a local base, limits, network) and cleans up
after itself and after runs that died. Envs depend on this module only, never on a runtime's
module, so ``docker`` and ``local`` are interchangeable behind ``custom_envs.<Tag>.runtime``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

RuntimeKind = Literal["docker", "local"]


@dataclass(frozen=True)
class WorkspaceSpec:
    """What one episode's workspace is built from, and its limits.

    ``image`` names a Docker image (the docker runtime builds ``dockerfile`` into it once, cached by
    the content hash of its build context, when the image is missing); the local runtime ignores
    images and copies ``files`` into a fresh directory. ``files`` are copied into ``workdir`` before
    the agent's first command: the task's starting repository or files.
    """

    image: str
    workdir: str = "/workspace"
    files: Path | None = None
    dockerfile: Path | None = None
    cpus: float = 1.0
    memory_mb: int = 1024
    pids_limit: int = 256
    network: bool = False
    disk_mb: int = 512
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ExecResult:
    """One command's outcome: exit code (None when it timed out or was killed), output and timing.

    ``output`` is stdout and stderr interleaved, cut to the runtime's output cap keeping the head and
    the tail with a marker between them; ``truncated`` says whether that happened.
    """

    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    seconds: float


@dataclass(frozen=True)
class WorkspaceStats:
    """How a workspace started: whether it came warm from a pool, and how long the start took."""

    pool_hit: bool
    start_s: float
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Workspace(Protocol):
    """One episode's isolated shell. Every method may raise ``WorkspaceError`` when the workspace died."""

    stats: WorkspaceStats

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float,
        user: Literal["agent", "root"] = "agent",
        workdir: str | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``bash -lc`` in ``workdir`` (default: the spec's) as the agent or as root."""
        ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create or replace the file at ``path`` (absolute, or relative to the workdir) as root."""
        ...

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20) -> bytes:
        """The first ``max_bytes`` of the file at ``path``; ``WorkspaceError`` when it does not exist."""
        ...

    async def copy_in(self, source: Path, dest: str) -> None:
        """Copy a host directory's contents (or one file) to ``dest`` inside the workspace, as root."""
        ...

    async def kill_agent_processes(self) -> None:
        """Kill every process the agent user started (before the verifier runs)."""
        ...

    async def close(self) -> None:
        """Remove the workspace and everything in it; safe to call twice."""
        ...


@runtime_checkable
class WorkspaceRuntime(Protocol):
    """Starts workspaces for one run and cleans up: its own at shutdown, dead runs' at start-up."""

    kind: RuntimeKind

    async def start(self, spec: WorkspaceSpec) -> Workspace:
        """A fresh workspace for ``spec`` (from a warm pool where the runtime keeps one)."""
        ...

    def alive(self) -> int:
        """Workspaces this runtime holds now (open ones, and warm ones where it keeps a pool)."""
        ...

    async def shutdown(self) -> None:
        """Remove every workspace this runtime started and still holds; safe to call twice."""
        ...
