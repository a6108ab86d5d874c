"""Starting and joining Ray the same way everywhere (pipelines, tests, benchmarks), and reading its errors."""

from __future__ import annotations

import os
from typing import Any

from roll_async.run_output.logs import LOG_DIR_ENV

# Ray is imported inside the functions: importing this module must not import Ray.


def actor_death_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call on an actor whose process is gone (killed, crashed), as opposed to one that raised."""
    try:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    except ImportError:  # an old Ray: RayActorError covers both
        from ray.exceptions import RayActorError

        return (RayActorError,)
    return (RayActorError, ActorDiedError, ActorUnavailableError)


def unwrap_ray_error(exc: BaseException) -> BaseException:
    """Ray wraps an actor's exception; the original (e.g. EngineStartupError) when it has one."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def describe_ray_error(exc: BaseException) -> str:
    """``Type: message`` of the error under Ray's wrapper, for logs and error messages."""
    original = unwrap_ray_error(exc)
    return f"{type(original).__name__}: {original}"


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    log_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Join ``address`` (a Ray cluster; else ``$RAY_ADDRESS``, as Ray's own tools do) or start a local instance.

    A no-op if Ray is already up.

    ``log_dir``: worker processes (engines, env workers, their children) write their output there instead of
    the driver's console (roll_async.run_output.logs).
    """
    import ray

    if ray.is_initialized():
        return
    # Quiet, offline-friendly defaults: no dashboard, no usage reporting, vLLM warnings only
    # (set VLLM_LOGGING_LEVEL=INFO to see the engine's own progress lines).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    runtime_env: dict[str, Any] = {
        "env_vars": {"VLLM_LOGGING_LEVEL": os.environ["VLLM_LOGGING_LEVEL"]}
    }
    quiet: dict[str, Any] = {}
    if log_dir is not None:
        runtime_env["env_vars"][LOG_DIR_ENV] = str(os.path.abspath(log_dir))
        runtime_env["worker_process_setup_hook"] = (
            "roll_async.run_output.logs.setup_worker_process"
        )
        quiet = {"log_to_driver": False, "configure_logging": False}
    # Ray joins $RAY_ADDRESS when no address is given, and then refuses num_cpus: join it explicitly.
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(
            address=address, include_dashboard=False, runtime_env=runtime_env, **quiet
        )
    else:
        ray.init(
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=False,
            runtime_env=runtime_env,
            **quiet,
        )
