"""Test aids for workspace runtimes: which runtimes a test runs against, and what each leaves behind.

The contract tests (tests/unit/workspaces) and the red-team probes (tests/security/test_swe_probes.py)
run once per runtime in :data:`RUNTIMES` that this host can start. A runtime that cannot start is
skipped with the reason, except docker where ``ROLL_ASYNC_REQUIRE_DOCKER`` is set (.ci/run sets it
after scripts/docker_setup.sh): there a missing daemon fails the tests instead of hiding them.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from roll_async.errors import CallTimeoutError, InvalidTypeError, WorkspaceError
from roll_async.workspaces.docker import connect
from roll_async.workspaces.docker_reaper import LABEL_RUN
from roll_async.workspaces.docker_workspace import DockerWorkspace
from roll_async.workspaces.interface import Workspace
from roll_async.workspaces.local import LocalWorkspace, host_problem, pids_of

RUNTIMES: tuple[str, ...] = ("local", "docker")
#: Set: a docker runtime that cannot start fails its tests rather than skipping them.
REQUIRE_DOCKER = "ROLL_ASYNC_REQUIRE_DOCKER"

#: One Engine API client for the containment checks, made on first use.
_API: list[Any] = []


def docker_problem() -> str | None:
    """Why no Docker daemon can be used from here (None: one answers)."""
    try:
        _docker_api()
    except WorkspaceError as exc:
        return str(exc)
    return None


def skip_reason(kind: str) -> str | None:
    """Why runtime ``kind`` cannot start on this host (None: it can, or it must and its tests will say why not)."""
    if kind == "local":
        problem = host_problem()
        return f"local workspaces need {problem}" if problem else None
    if kind == "docker":
        if os.environ.get(REQUIRE_DOCKER):
            return None
        problem = docker_problem()
        return f"{problem} ({REQUIRE_DOCKER}=1 makes this fail)" if problem else None
    return f"no containment check for runtime {kind!r} yet (add one to leftovers)"


def runtime_config(kind: str, output_cap: int = 4096) -> dict[str, Any]:
    """The ``runtime_config`` the tests give ``kind``: a small output cap, and a small warm pool."""
    if kind == "local":
        return {"max_output_bytes": output_cap}
    return {"output_cap_bytes": output_cap, "pool_size": 1}


def owners(workspace: Workspace) -> Any:
    """What identifies the workspace's processes and files, captured before it closes.

    local: its two uids and its folder; docker: its container (and the run whose label it carries).
    """
    if isinstance(workspace, LocalWorkspace):
        return ("local", workspace.agent_uid, workspace.verifier_uid, workspace.home)
    if isinstance(workspace, DockerWorkspace):
        labels = _docker_api().inspect_container(workspace.container_id)["Config"][
            "Labels"
        ]
        return ("docker", workspace.container_id, labels.get(LABEL_RUN, ""))
    raise InvalidTypeError(f"no containment check for {type(workspace).__name__}")


def leftovers(identity: Any) -> list[str]:
    """What of a closed workspace is still there (processes, files, containers), from :func:`owners`; empty when contained."""
    if identity[0] == "docker":
        _, container_id, run_id = identity
        found = _docker_api().containers(
            all=True, filters={"id": container_id, "label": f"{LABEL_RUN}={run_id}"}
        )
        return [f"container {c['Id'][:12]} ({c.get('State')})" for c in found]
    _, agent_uid, verifier_uid, home = identity
    left = [
        f"process {pid} of uid {uid}"
        for uid in (agent_uid, verifier_uid)
        for pid in pids_of(uid)
    ]
    if os.path.exists(home):
        left.append(f"folder {home}")
    return left


def _docker_api() -> Any:
    if not _API:
        _API.append(connect(30.0))
    return _API[0]


async def kill_container_running(
    run_id: str, command: str, timeout_s: float = 60.0
) -> str:
    """SIGKILL the first container of ``run_id`` found running a process whose command line holds
    ``command`` (a workspace mid-episode, as an OOM kill or a crashed node would end it); its id.

    Polls the run's containers (``docker top``) until one runs it; raises CallTimeoutError after ``timeout_s``.
    """
    api = _docker_api()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for container in await asyncio.to_thread(
            api.containers, filters={"label": f"{LABEL_RUN}={run_id}"}
        ):
            try:
                top = await asyncio.to_thread(api.top, container["Id"])
            except Exception:  # removed or stopped between the listing and the look
                continue
            if any(command in " ".join(row) for row in top.get("Processes") or []):
                await asyncio.to_thread(api.kill, container["Id"])
                return str(container["Id"])
        await asyncio.sleep(0.05)
    raise CallTimeoutError(
        f"no container of run {run_id} ran {command!r} within {timeout_s:g} s"
    )
