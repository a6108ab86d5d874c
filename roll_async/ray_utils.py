"""Starting and joining Ray the same way everywhere (pipelines, tests, benchmarks)."""

from __future__ import annotations

import os

import ray


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join ``address`` (a Ray cluster) or start a local instance; a no-op if Ray is already up."""
    if ray.is_initialized():
        return
    # Quiet, offline-friendly defaults: no dashboard, no usage reporting, vLLM warnings only
    # (set VLLM_LOGGING_LEVEL=INFO to see the engine's own progress lines).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    runtime_env = {"env_vars": {"VLLM_LOGGING_LEVEL": os.environ["VLLM_LOGGING_LEVEL"]}}
    if address:
        ray.init(address=address, include_dashboard=False, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 2, include_dashboard=False, runtime_env=runtime_env)
