"""The docker workspace runtime: one container per episode, from a warm pool, and nothing left behind.

Each workspace is a container of the spec's image (its Dockerfile built once when the image is missing,
:mod:`.docker_images`) with the spec's CPU, memory and process limits, no network unless the spec asks,
a read-only root file system whose workdir and /tmp are the container's own tmpfs volumes (the workdir
as large as the spec's ``disk_mb``; a plain volume keeping the image's files when the spec copies none
in), a file-size rlimit, and ``sleep infinity`` under Docker's init as its main process; the agent's
commands arrive through exec (:mod:`.docker_workspace`). Containers come pre-started from
:mod:`.docker_pool`, so an episode pays for copying its files, not for a container start. Every container is labelled with the run and its owner
process; the runtime removes its own at shutdown (or exit, or SIGTERM) and, when it starts, those of
dead owners on this host (:mod:`.docker_reaper`). The daemon is the one ``DOCKER_HOST`` (or the local
socket) names on the node the runtime runs on. Needs the ``docker`` package: ``pip install
'roll-async[swe]'``; the daemon and base image: scripts/docker_setup.sh.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from roll_async.config.field_checks import from_mapping
from roll_async.errors import ConfigError, WorkspaceError
from roll_async.workspaces.docker_exec import run_exec
from roll_async.workspaces.docker_images import ensure_image
from roll_async.workspaces.docker_pool import WarmPool
from roll_async.workspaces.docker_reaper import (
    SHUTDOWN_HOOKS,
    count_run,
    owner_labels,
    reap_dead_owners,
    remove_container,
    remove_owned,
    remove_run,
)
from roll_async.workspaces.docker_workspace import DockerWorkspace
from roll_async.workspaces.interface import RuntimeKind, WorkspaceSpec, WorkspaceStats

logger = logging.getLogger(__name__)

DAEMON_FIX = "run scripts/docker_setup.sh as root (it installs and starts dockerd) or set DOCKER_HOST to a daemon"


@dataclass(frozen=True)
class DockerRuntimeConfig:
    """How the docker runtime runs its containers.

    ``run_id`` labels every container (empty: a fresh id per runtime); ``pool_size`` warm containers
    wait per spec (0: every start is cold); ``agent_user`` is the ``uid:gid`` agent commands run as;
    ``output_cap_bytes`` of a command's output are kept (head and tail); ``exec_grace_s`` after a
    command's timeout the host stops waiting and kills what is left of it; ``api_timeout_s`` bounds each
    Engine API call; ``threads`` run the blocking API calls (one per concurrent command);
    ``reap_dead_owners`` removes, at start-up, the containers of processes on this host that died;
    ``file_size_mb`` is the largest file a process may write (an rlimit); ``tmp_mb`` the size of /tmp.
    The workdir is a tmpfs of the spec's ``disk_mb`` (it counts against the container's memory).
    """

    run_id: str = ""
    pool_size: int = 2
    agent_user: str = "1000:1000"
    output_cap_bytes: int = 64 * 1024
    exec_grace_s: float = 5.0
    api_timeout_s: float = 60.0
    read_only_root: bool = True
    threads: int = 64
    reap_dead_owners: bool = True
    file_size_mb: int = 64
    tmp_mb: int = 64

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+:\d+", self.agent_user):
            raise ConfigError(
                f"agent_user={self.agent_user!r}: give numeric uid:gid, e.g. 1000:1000"
            )
        for key in (
            "pool_size",
            "output_cap_bytes",
            "threads",
            "file_size_mb",
            "tmp_mb",
        ):
            if getattr(self, key) < (0 if key == "pool_size" else 1):
                raise ConfigError(
                    f"{key}={getattr(self, key)} is out of range: give a positive number"
                )


def docker_config(
    config: DockerRuntimeConfig | Mapping[str, Any] | None,
) -> DockerRuntimeConfig:
    """A :class:`DockerRuntimeConfig` from None, itself or a mapping (the env_config's ``runtime_config``).

    An unknown key fails naming it and the accepted ones, so a typo is not silently a default.
    """
    runtime: DockerRuntimeConfig = from_mapping(
        DockerRuntimeConfig, config, "runtime_config", "the docker runtime"
    )
    return runtime


def connect(timeout_s: float, connections: int = 10) -> Any:
    """A low-level Engine API client for DOCKER_HOST (or the local socket) that has answered a ping.

    ``connections``: its connection pool's size; each running command holds one connection.
    """
    try:
        import docker
    except ImportError as exc:
        raise WorkspaceError(
            "the docker Python package is missing: pip install 'roll-async[swe]'"
        ) from exc
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(
            timeout=max(1, int(timeout_s)), max_pool_size=connections
        )
        client.ping()
    except Exception as exc:
        raise WorkspaceError(
            f"no Docker daemon answers at {where} ({type(exc).__name__}): {DAEMON_FIX}"
        ) from exc
    return client.api


def remove_run_containers(run_id: str, timeout_s: float = 30.0) -> int:
    """Remove every container labelled with ``run_id`` (any process's); how many there were.

    The training driver calls it at the end of a run, after the env workers shut down their runtimes:
    what it finds then leaked.
    """
    return remove_run(connect(timeout_s), run_id)


class DockerRuntime:
    """Starts docker workspaces for one run; see the module docstring."""

    kind: RuntimeKind = "docker"

    def __init__(
        self, config: DockerRuntimeConfig | Mapping[str, Any] | None = None
    ) -> None:
        self.config = docker_config(config)
        self.run_id = self.config.run_id or f"run-{uuid.uuid4().hex[:12]}"
        self._api = connect(self.config.api_timeout_s, self.config.threads)
        self.reaped = reap_dead_owners(self._api) if self.config.reap_dead_owners else 0
        self._executor = ThreadPoolExecutor(
            max_workers=self.config.threads, thread_name_prefix="docker-workspace"
        )
        self._open: dict[str, DockerWorkspace] = {}
        # image reference per image name or Dockerfile spec, resolved (and built) once per runtime
        self._images: dict[str | WorkspaceSpec, str] = {}
        self._pool = WarmPool(self.config.pool_size, self._create, self._remove)
        self._closed = False
        SHUTDOWN_HOOKS.register(id(self), self._remove_all_now)

    async def start(self, spec: WorkspaceSpec) -> DockerWorkspace:
        """A fresh workspace for ``spec``, warm from the pool when one waits, with ``spec.files`` copied in."""
        if self._closed:
            raise WorkspaceError(
                f"the docker runtime of {self.run_id} is shut down: start a new one"
            )
        began = time.monotonic()
        container_id, hit = await self._pool.take(spec)
        container_s = time.monotonic() - began
        if (
            self._closed
        ):  # shut down (its thread pool too) while this start waited for its container
            await asyncio.to_thread(self._remove_blocking, container_id)
            raise WorkspaceError(
                f"the docker runtime of {self.run_id} shut down during a start: start a new one"
            )
        workspace = DockerWorkspace(
            self._api,
            container_id,
            spec,
            agent_user=self.config.agent_user,
            output_cap=self.config.output_cap_bytes,
            grace_s=self.config.exec_grace_s,
            executor=self._executor,
            on_close=self._forget,
            stats=WorkspaceStats(pool_hit=hit, start_s=container_s),
        )
        self._open[container_id] = workspace
        if spec.files is not None:
            try:
                await workspace.copy_in(spec.files, spec.workdir)
            except BaseException:
                await workspace.close()
                raise
        workspace.stats = WorkspaceStats(
            pool_hit=hit,
            start_s=time.monotonic() - began,
            extra={"container_s": container_s},
        )
        return workspace

    async def warm(self, spec: WorkspaceSpec) -> None:
        """Fill ``spec``'s warm pool now (building its image if needed) and wait until it is full."""
        await self._pool.warm(spec)

    def alive(self) -> int:
        """Containers this runtime holds now: the episodes' open workspaces and the warm ones waiting."""
        return len(self._open) + self._pool.idle()

    def containers(self) -> int:
        """How many containers of this run exist on the daemon (started by any process)."""
        return count_run(self._api, self.run_id)

    async def shutdown(self) -> None:
        """Remove every container this runtime started and still holds; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._pool.close()
        except (RuntimeError, ValueError) as exc:
            # the pool's tasks belong to a loop that closed (an env reset on one loop, closed on another,
            # as a preflight check does): the label sweep below removes what the pool held
            logger.debug(
                "warm pool of %s closed from another loop: %s", self.run_id, exc
            )
        await asyncio.gather(
            *(workspace.close() for workspace in list(self._open.values())),
            return_exceptions=True,
        )
        loop = asyncio.get_running_loop()
        # the label sweep also finds a container whose creation raced the pool's close
        await loop.run_in_executor(self._executor, remove_owned, self._api, self.run_id)
        SHUTDOWN_HOOKS.unregister(id(self))
        self._executor.shutdown(wait=False)

    # -- containers ------------------------------------------------------------------------------------

    async def _create(self, spec: WorkspaceSpec) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._create_blocking, spec)

    def _create_blocking(self, spec: WorkspaceSpec) -> str:
        import docker.errors
        import docker.types

        image = self._images.get(spec.image if spec.dockerfile is None else spec)
        if image is None:
            image = ensure_image(self._api, spec)
            self._images[spec.image if spec.dockerfile is None else spec] = image
        fsize = self.config.file_size_mb << 20
        uid, gid = self.config.agent_user.split(":")
        ids = f"uid={uid},gid={gid}"
        host_config = self._api.create_host_config(
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9),
            pids_limit=spec.pids_limit,
            network_mode="bridge" if spec.network else "none",
            read_only=self.config.read_only_root,
            init=True,
            security_opt=["no-new-privileges"],
            ulimits=[
                docker.types.Ulimit(name="fsize", soft=fsize, hard=fsize),
            ],
            mounts=[
                # a workdir the image fills keeps the image's files (a plain volume: disk_mb not enforced)
                _tmpfs_volume(spec.workdir, spec.disk_mb, f"mode=0755,{ids}")
                if spec.files is not None
                else docker.types.Mount(spec.workdir, None, type="volume"),
                _tmpfs_volume("/tmp", self.config.tmp_mb, "mode=1777"),
            ],
        )
        try:
            container_id: str = self._api.create_container(
                image,
                entrypoint=["sleep", "infinity"],
                command=[],
                labels={**owner_labels(self.run_id), "roll-async.image": spec.image},
                working_dir=spec.workdir,
                host_config=host_config,
            )["Id"]
        except docker.errors.APIError as exc:
            raise WorkspaceError(
                f"creating a container of {spec.image} failed: {exc.explanation or exc}; "
                "check the spec's limits and image"
            ) from exc
        try:
            self._api.start(container_id)
            if spec.files is not None:
                return container_id  # the tmpfs volumes were made with their owner and mode
            # a plain workdir volume holds the image's files, root-owned: the agent must edit them
            owner = self.config.agent_user
            raw = run_exec(
                self._api,
                container_id,
                [
                    "sh",
                    "-c",
                    'mkdir -p -- "$1" && chown -R "$2" -- "$1" && chmod 1777 /tmp',
                    "sh",
                    spec.workdir,
                    owner,
                ],
                user="0:0",
                workdir="/",
                environment={},
                deadline_s=30.0,
                cap=4096,
            )
            if raw.exit_status != 0:
                raise WorkspaceError(
                    f"preparing a container of {spec.image} failed (exit {raw.exit_status}: "
                    f"{raw.output.strip()[:200]}); the image needs sh, mkdir and chown"
                )
        except BaseException as exc:
            self._remove_blocking(container_id)
            if isinstance(exc, docker.errors.APIError):
                raise WorkspaceError(
                    f"starting a container of {spec.image} failed: {exc.explanation or exc}"
                ) from exc
            raise
        return container_id

    async def _remove(self, container_id: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._remove_blocking, container_id)

    def _remove_blocking(self, container_id: str) -> None:
        remove_container(self._api, container_id)

    def _forget(self, container_id: str) -> None:
        self._open.pop(container_id, None)

    def _remove_all_now(self) -> None:
        """The exit and signal path: a fresh client (no lock an interrupted call may hold) sweeps our labels."""
        removed = remove_owned(connect(10.0), self.run_id)
        if removed:
            logger.info(
                "removed %d workspace containers of %s at exit", removed, self.run_id
            )


def _tmpfs_volume(target: str, size_mb: int, options: str) -> Any:
    """An anonymous volume at ``target`` backed by a tmpfs of ``size_mb`` MiB with mount ``options`` (its
    owner and mode), removed with its container.

    A volume rather than a plain tmpfs mount: the archive API (``copy_in``) writes into volumes, not into
    a container's tmpfs mounts. The image's files at ``target`` are not copied into it.
    """
    import docker.types

    return docker.types.Mount(
        target,
        None,
        type="volume",
        driver_config=docker.types.DriverConfig(
            "local",
            {
                "type": "tmpfs",
                "device": "tmpfs",
                "o": f"size={max(1, int(size_mb))}m,{options}",
            },
        ),
    )
