"""Load Harbor task directories into :class:`TaskSpec` s, checking ``task.toml`` against Harbor's task model.

Harbor (laude-institute/harbor) is the task format of Terminal-Bench 2 and its adapters: a folder
with ``task.toml``, ``instruction.md``, ``environment/Dockerfile``, ``tests/test.sh`` and optionally
``solution/solve.sh``. Reading them directly lets an existing task set run here unchanged; a key
Harbor does not know fails here, naming it, instead of being ignored.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from roll_async.envs.swe.task_spec import TaskSpec
from roll_async.errors import DatasetError, MissingFileError

#: The keys of Harbor's ``TaskConfig`` (src/harbor/models/task/config.py: TaskConfig, VerifierConfig,
#: AgentConfig, EnvironmentConfig, SolutionConfig), per section; None: a free-form table.
HARBOR_FIELDS: dict[str, frozenset[str] | None] = {
    "verifier": frozenset(
        {"timeout_sec", "env", "user", "network_mode", "allowed_hosts"}
    ),
    "agent": frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"}),
    "environment": frozenset(
        {
            "build_timeout_sec",
            "docker_image",
            "cpus",
            "memory_mb",
            "storage_mb",
            "gpus",
            "gpu_types",
            "allow_internet",
            "network_mode",
            "allowed_hosts",
            "mcp_servers",
            "env",
            "skills_dir",
            "healthcheck",
            "memory",
            "storage",
        }
    ),
    "solution": frozenset({"env"}),
    "metadata": None,
    "task": None,
}
#: Top-level keys of ``TaskConfig`` that are not sections.
HARBOR_TOP_KEYS = frozenset({"version", "schema_version", "source"})
#: Harbor's defaults where ``task.toml`` leaves a number out.
_DEFAULTS = {
    ("verifier", "timeout_sec"): 600.0,
    ("agent", "timeout_sec"): 600.0,
    ("environment", "build_timeout_sec"): 600.0,
    ("environment", "cpus"): 1,
    ("environment", "memory_mb"): 2048,
    ("environment", "storage_mb"): 10240,
}


def _number(config: dict[str, Any], section: str, key: str, path: Path) -> float:
    value = config.get(section, {}).get(key)
    if value is None:
        return float(_DEFAULTS[(section, key)])
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise DatasetError(
            f"{path}: [{section}] {key} must be a positive number, got {value!r}"
        )
    return float(value)


def parse_task_toml(path: Path) -> dict[str, Any]:
    """``task.toml`` as a dict, its sections and keys checked against :data:`HARBOR_FIELDS`."""
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable TOML file: {exc}") from exc
    for key, value in config.items():
        if key in HARBOR_TOP_KEYS:
            continue
        if key not in HARBOR_FIELDS:
            raise DatasetError(
                f"{path}: unknown key {key!r}; Harbor's task.toml has "
                f"{', '.join(sorted(HARBOR_TOP_KEYS | set(HARBOR_FIELDS)))}"
            )
        if not isinstance(value, dict):
            raise DatasetError(f"{path}: [{key}] must be a table, got {value!r}")
        accepted = HARBOR_FIELDS[key]
        if accepted is not None:
            unknown = sorted(set(value) - accepted)
            if unknown:
                raise DatasetError(
                    f"{path}: [{key}] has unknown key {unknown[0]!r}; accepted: {', '.join(sorted(accepted))}"
                )
    return config


def _required(path: Path) -> Path:
    if not path.is_file():
        raise MissingFileError(f"Harbor task file {path} is missing")
    return path


def load_harbor_task(task_dir: str | Path) -> TaskSpec:
    """One Harbor task directory; a missing ``instruction.md``, ``task.toml`` or ``tests/test.sh`` fails naming the path."""
    task_dir = Path(task_dir).resolve()
    config = parse_task_toml(_required(task_dir / "task.toml"))
    instruction = _required(task_dir / "instruction.md").read_text(encoding="utf-8")
    _required(task_dir / "tests" / "test.sh")
    solve = task_dir / "solution" / "solve.sh"
    dockerfile = task_dir / "environment" / "Dockerfile"
    workspace = task_dir / "environment" / "workspace"
    environment = config.get("environment", {})
    metadata = dict(config.get("metadata", {}))
    # Harbor's default is allow_internet = true; here a task gets the network only when it says so
    network = environment.get("allow_internet", False) is True or environment.get(
        "network_mode"
    ) in ("public", "allowlist")
    return TaskSpec(
        task_id=str(config.get("task", {}).get("name") or task_dir.name),
        format="harbor",
        instruction=instruction.strip(),
        image=str(
            environment.get("docker_image")
            or f"roll-async/swe-task-{task_dir.name.lower()}"
        ),
        files=workspace if workspace.is_dir() else None,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        tests_dir=task_dir / "tests",
        solution=solve.read_text(encoding="utf-8") if solve.is_file() else None,
        agent_timeout_s=_number(config, "agent", "timeout_sec", task_dir / "task.toml"),
        verifier_timeout_s=_number(
            config, "verifier", "timeout_sec", task_dir / "task.toml"
        ),
        build_timeout_s=_number(
            config, "environment", "build_timeout_sec", task_dir / "task.toml"
        ),
        cpus=_number(config, "environment", "cpus", task_dir / "task.toml"),
        memory_mb=int(
            _number(config, "environment", "memory_mb", task_dir / "task.toml")
        ),
        storage_mb=int(
            _number(config, "environment", "storage_mb", task_dir / "task.toml")
        ),
        network=bool(network),
        summary_required=metadata.get("roll_async_summary") is True,
        metadata=metadata,
    )


def load_harbor_tasks(path: str | Path) -> list[TaskSpec]:
    """A task directory (it has ``task.toml``) or a folder of them, in name order."""
    path = Path(path)
    if (path / "task.toml").is_file():
        return [load_harbor_task(path)]
    if not path.is_dir():
        raise MissingFileError(f"Harbor task path {path} is not a directory")
    tasks = [
        load_harbor_task(child)
        for child in sorted(path.iterdir())
        if child.is_dir() and not child.name.startswith(".")
    ]
    if not tasks:
        raise DatasetError(
            f"{path} holds no Harbor task directory (a folder with task.toml)"
        )
    return tasks
