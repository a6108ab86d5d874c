"""What a run tells envs that hold things outside their worker process, and what it sweeps at its end.

The swe env's docker runtime starts containers, which outlive a worker that dies; labelled with the
run's id they can be found and removed by the driver whatever happened to the workers. An env class
opts in with two class methods: ``run_env_config(env_config, run_id)`` (the env_config its envs get in
this run) and ``end_run(env_config, run_id)`` (after every env closed: remove what is left, and say how
much as metrics). Only registered env types are asked; user classes may define the same methods.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from roll_async.config.schema import PipelineConfig
from roll_async.envs.registry import registered_envs, resolve_env_class

logger = logging.getLogger(__name__)
#: The metrics end_env_runs reports go under this prefix (workspace/containers_leaked).
PREFIX = "workspace/"


def new_run_id(run_dir_name: str) -> str:
    """A run id unique on this host: the run directory's name and a random suffix."""
    return f"{run_dir_name}-{uuid.uuid4().hex[:8]}"


def _hook(env_type: str, name: str) -> Callable[..., Any] | None:
    if env_type not in registered_envs():
        return None
    hook: Callable[..., Any] | None = getattr(resolve_env_class(env_type), name, None)
    return hook


def label_env_runs(config: PipelineConfig, run_id: str) -> None:
    """Give every tag whose env class asks for it its env_config for run ``run_id`` (in place, before the envs start)."""
    for env in config.custom_envs.values():
        hook = _hook(env.env_type, "run_env_config")
        if hook is not None:
            env.env_config = hook(dict(env.env_config), run_id)


def end_env_runs(config: PipelineConfig, run_id: str) -> dict[str, float]:
    """Sweep what the run's envs left (after every env closed); the summed metrics, e.g. ``containers_leaked``."""
    totals: dict[str, float] = {}
    for tag, env in config.custom_envs.items():
        hook = _hook(env.env_type, "end_run")
        if hook is None:
            continue
        try:
            metrics = hook(dict(env.env_config), run_id)
        except (
            Exception
        ) as exc:  # a sweep that fails must not hide the run's own outcome
            logger.warning("tag %s: sweeping run %s failed: %s", tag, run_id, exc)
            continue
        for key, value in metrics.items():
            totals[PREFIX + key] = totals.get(PREFIX + key, 0.0) + float(value)
    leaked = totals.get(PREFIX + "containers_leaked", 0.0)
    if leaked:
        logger.warning(
            "run %s left %d workspace containers; removed them", run_id, leaked
        )
    return totals
