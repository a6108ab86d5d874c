"""Build the workspace runtime a config names (``custom_envs.<Tag>.env_config.runtime: docker | local``).

Envs and tests ask here rather than importing a runtime's module, so the docker runtime (and the
Docker SDK it needs) is imported only when a config asks for it, and a host without it gets one
line naming the fix instead of an import error at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

from roll_async.errors import ConfigError, UnsupportedHostError
from roll_async.workspaces.interface import RuntimeKind, WorkspaceRuntime
from roll_async.workspaces.local import LocalRuntime, local_config

RUNTIME_KINDS: tuple[RuntimeKind, ...] = ("docker", "local")
#: The module and class of the docker runtime, imported on first use.
DOCKER_MODULE, DOCKER_CLASS = "roll_async.workspaces.docker", "DockerRuntime"


def _docker_module() -> Any:
    try:
        return importlib.import_module(DOCKER_MODULE)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        what = (
            f"{DOCKER_MODULE}, which this install does not have"
            if missing == DOCKER_MODULE
            else f"the module {missing!r} (install it, e.g. pip install docker)"
        )
        raise UnsupportedHostError(
            f"runtime: docker needs {what}; set runtime: local to use the namespace sandbox"
        ) from exc


def sweep_run(kind: str, run_id: str) -> int:
    """Remove what runtime ``kind`` left of run ``run_id`` anywhere on its host (docker: the run's labelled
    containers); how much there was. The local runtime's workspaces die with their process: 0."""
    if kind == "docker":
        removed: int = _docker_module().remove_run_containers(run_id)
        return removed
    return 0


def make_runtime(
    kind: str, config: Mapping[str, Any] | None = None
) -> WorkspaceRuntime:
    """A new runtime of ``kind`` with its own ``config`` (the env_config's ``runtime_config``)."""
    if kind == "local":
        return LocalRuntime(local_config(config))
    if kind == "docker":
        module = _docker_module()
        runtime_cls = getattr(module, DOCKER_CLASS, None)
        if runtime_cls is None:
            raise UnsupportedHostError(
                f"{DOCKER_MODULE} has no {DOCKER_CLASS}; set runtime: local to use the namespace sandbox"
            )
        # DockerRuntime checks the mapping's keys (docker_config): an unknown one fails naming it
        return cast(WorkspaceRuntime, runtime_cls(dict(config or {})))
    raise ConfigError(f"runtime={kind!r} is not one of {list(RUNTIME_KINDS)}")
