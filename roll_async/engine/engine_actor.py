"""Ray hosting for VLLMEngine: launch replicas with a startup deadline, reach them, shut them down cleanly.

The engine runs as an async Ray actor with a high ``max_concurrency`` so that
hundreds of EnvManagers can await ``generate`` at once while vLLM batches them
continuously; a replica that never starts must fail the run with a reason, not
hang it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from roll_async.config.schema import EngineConfig
from roll_async.engine.lora_adapters import LoraServing
from roll_async.engine.router import RayEngineClient
from roll_async.engine.vllm_engine import VLLMEngine
from roll_async.engine.zmq_engine_client import ZmqEngineClient
from roll_async.errors import EngineStartupError
from roll_async.runtime import node_files
from roll_async.runtime.ray_utils import unwrap_ray_error

logger = logging.getLogger(__name__)

#: Concurrent calls one engine actor accepts; far above any realistic env count per replica.
ACTOR_MAX_CONCURRENCY = 100_000


def _gpus_per_replica(config: EngineConfig) -> float:
    has_gpu = ray.cluster_resources().get("GPU", 0) > 0
    return float(config.tensor_parallel_size) if has_gpu else 0.0


async def _start_replicas(actors: list[Any], model_path: str) -> list[dict[str, Any]]:
    """Start every replica; one whose node lacks ``model_path`` gets the driver's model files (put once)."""
    on_node = await asyncio.gather(
        *(actor.model_dir_on_node.remote() for actor in actors)
    )
    files_ref = None
    if not all(on_node):
        # {} if the driver lacks it too: the replica's start then fails naming model.path and its node.
        files = await asyncio.to_thread(node_files.model_files, model_path)
        if files:
            size_mib = sum(len(data) for data in files.values()) / (1 << 20)
            missing = [index for index, present in enumerate(on_node) if not present]
            logger.warning(
                "model.path %r is missing on the node of engine replica(s) %s: shipping its %d files (%.1f MiB) "
                "through the object store; a shared filesystem avoids this copy",
                model_path,
                missing,
                len(files),
                size_mib,
            )
            files_ref = await asyncio.to_thread(ray.put, files)
    started: list[dict[str, Any]] = await asyncio.gather(
        *(
            actor.start.remote(None if present else files_ref)
            for actor, present in zip(actors, on_node)
        )
    )
    return started


async def launch_engines(
    model_path: str,
    config: EngineConfig,
    *,
    name_prefix: str = "roll_async_engine",
    lora: LoraServing | None = None,
) -> list[Any]:
    """Start ``config.num_replicas`` engine actors and wait until each has loaded the model.

    ``lora``: the replicas serve the run's LoRA adapters (trainer.lora.sync=adapter).

    Raises EngineStartupError (naming the option, path or timeout) and kills every
    replica it started if any fails, so a bad config never leaves processes behind.
    """
    actor_cls = ray.remote(VLLMEngine)
    num_gpus = _gpus_per_replica(config)
    actors = [
        actor_cls.options(
            name=f"{name_prefix}_{index}",
            num_cpus=0,
            num_gpus=num_gpus,
            max_concurrency=ACTOR_MAX_CONCURRENCY,
            max_restarts=0,
        ).remote(model_path, config, lora)
        for index in range(config.num_replicas)
    ]
    try:
        infos = await asyncio.wait_for(
            _start_replicas(actors, model_path), timeout=config.startup_timeout_s
        )
    except TimeoutError:
        await shutdown_engines(actors)
        raise EngineStartupError(
            f"engine did not start within engine.startup_timeout_s={config.startup_timeout_s}s "
            f"(model {model_path!r}); raise the timeout or check the engine log above"
        ) from None
    except Exception as exc:
        await shutdown_engines(actors)
        original = unwrap_ray_error(exc)
        if isinstance(original, EngineStartupError):
            raise EngineStartupError(str(original)) from None
        raise EngineStartupError(
            f"engine failed to start: {type(original).__name__}: {original}"
        ) from None
    for index, info in enumerate(infos):
        logger.info("engine replica %d ready: %s", index, info)
    return actors


def engine_clients(
    handles: list[Any], request_transport: str
) -> list[RayEngineClient] | list[ZmqEngineClient]:
    """One client per engine replica actor, sending generate requests by ``engine.request_transport``."""
    if request_transport == "ray":
        return [RayEngineClient(handle) for handle in handles]
    node_id = ray.get_runtime_context().get_node_id()
    return [ZmqEngineClient(handle, node_id=node_id) for handle in handles]


async def shutdown_engines(actors: list[Any], timeout_s: float = 60.0) -> None:
    """Shut each replica's vLLM down, then kill the actor; never raises."""
    for actor in actors:
        try:
            await asyncio.wait_for(actor.shutdown.remote(), timeout=timeout_s)
        except Exception as exc:  # a dead or stuck actor is killed below all the same
            logger.warning("engine shutdown did not complete cleanly: %s", exc)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
