"""Where the trainer runs: in the driver process, or in a Ray actor holding the GPUs Ray gives it.

On a cluster the trainer belongs on a node with a free GPU, not necessarily the
driver's; the pipeline holds a :class:`~roll_async.trainer.base.TrainerHandle`
whatever the placement (:class:`InProcessTrainer` in the driver,
:class:`TrainerActorClient` for an actor), so its code is the same for every placement.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from roll_async.config.sections import TrainerConfig
from roll_async.engine.weight_transport import pack_weight_buckets, put_buckets
from roll_async.errors import ConfigError, LifecycleError
from roll_async.runtime.ray_utils import unwrap_ray_error
from roll_async.trainer.base import Trainer, TrainerHandle
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.factory import build_model_trainer
from roll_async.trainer.grpo_trainer import resolve_device
from roll_async.trainer.ranks.rank_group import TrainerRankGroup
from roll_async.trainer.sft import run_sft
from roll_async.trainer.simulated import SimulatedTrainer

logger = logging.getLogger(__name__)

# Ray is imported inside the functions that use it: a driver-placed trainer never needs it.

#: CPUs the trainer actor reserves (it trains; it should not share its core with an env worker).
TRAINER_ACTOR_CPUS = 1


def pack_and_put_weights(trainer: Trainer) -> list[Any]:
    """The trainer's weights for the engines: safetensors buckets, each ``ray.put`` once by the calling process."""
    return put_buckets(pack_weight_buckets(trainer.state_dict_for_engine()))


class InProcessTrainer(TrainerHandle):
    """A :class:`Trainer` (the built-in GRPO one or a user's class) in this process, behind the whole TrainerHandle.

    A ``Trainer`` promises four methods; the rest of the handle is the same for every trainer held in
    the process that runs it: its weights are packed and put here, the SFT warm start trains its model
    here, and nothing outside needs stopping.
    """

    #: A real trainer (the simulated one is a TrainerHandle of its own).
    simulated = False

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    @property
    def model(self) -> Any:
        """The wrapped trainer's HF causal LM (optional in the Trainer contract; AttributeError without one)."""
        return self.trainer.model  # type: ignore[attr-defined]

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        return self.trainer.train_step(batch, step)

    def state_dict_for_engine(self) -> dict[str, Any]:
        return self.trainer.state_dict_for_engine()

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        self.trainer.save_checkpoint(directory, extra_state)

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        return self.trainer.load_checkpoint(directory)

    def engine_weight_refs(self) -> list[Any]:
        """Packed and put by this process, which holds the weights."""
        return pack_and_put_weights(self.trainer)

    def run_sft(self, examples: list[Any], **kwargs: Any) -> dict[str, float]:
        return run_sft(self.trainer, examples, **kwargs)

    def shutdown(self) -> None:
        """Nothing outside this process to stop; the trainer goes with it."""


class TrainerActor:
    """Holds the trainer in its own Ray worker process; created by :meth:`TrainerActorClient.start`."""

    def __init__(self) -> None:
        self.trainer: InProcessTrainer | None = None
        self.device = ""

    def _trainer(self) -> InProcessTrainer:
        if self.trainer is None:
            raise LifecycleError("TrainerActor: build() was not called")
        return self.trainer

    def build(self, config: TrainerConfig, model_path: str) -> dict[str, Any]:
        """Build the trainer on the device the GPUs Ray assigned this actor call for; return where it runs."""
        import ray

        gpu_ids = ray.get_gpu_ids()
        self.device = str(resolve_device(config.device, gpu_ids))
        # config validation keeps the simulated trainer in the driver
        self.trainer = InProcessTrainer(
            build_model_trainer(
                dataclasses.replace(config, device=self.device), model_path
            )
        )
        return self.placement()

    def placement(self) -> dict[str, Any]:
        """Node, assigned resources and device: what the pipeline logs and tests check."""
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "assigned_resources": dict(context.get_assigned_resources()),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": self.device,
        }

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        return self._trainer().train_step(batch, step)

    def state_dict_for_engine(self) -> dict[str, Any]:
        return self._trainer().state_dict_for_engine()

    def engine_weight_refs(self) -> list[Any]:
        # Owned by this actor, which lives for the run; the engines borrow them through the driver's refs.
        return self._trainer().engine_weight_refs()

    def save_checkpoint(self, directory: str, extra_state: dict[str, Any]) -> None:
        self._trainer().save_checkpoint(directory, extra_state)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        return self._trainer().load_checkpoint(directory)

    def run_sft(self, examples: list[Any], kwargs: dict[str, Any]) -> dict[str, float]:
        return self._trainer().run_sft(examples, **kwargs)


class TrainerActorClient(TrainerHandle):
    """The pipeline's handle on a :class:`TrainerActor`: the TrainerHandle methods, each a blocking Ray call.

    Errors raised in the actor (NonFiniteLossError, ConfigError, ...) are re-raised here as
    themselves, so the pipeline handles them as with a trainer in its own process.
    """

    #: A real trainer (the simulated one stays in the driver; config validation rejects it here).
    simulated = False

    def __init__(self, actor: Any, placement: dict[str, Any]) -> None:
        self.actor = actor
        #: Where the actor runs: node_id, assigned_resources, gpu_ids, device.
        self.placement = placement

    @classmethod
    def start(cls, config: TrainerConfig, model_path: str) -> TrainerActorClient:
        """Create the actor with ``num_gpus=config.num_gpus`` and build the trainer in it (Ray must be up)."""
        import ray

        cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        if config.num_gpus > cluster_gpus:
            # The actor would wait for resources forever; say so now.
            raise ConfigError(
                f"trainer.num_gpus={config.num_gpus} but the Ray cluster has {cluster_gpus:g} GPU(s); lower "
                "trainer.num_gpus or join a cluster with GPUs (ray_address)"
            )
        actor = (
            ray.remote(TrainerActor)
            .options(
                num_cpus=TRAINER_ACTOR_CPUS, num_gpus=config.num_gpus, max_restarts=0
            )
            .remote()
        )
        try:
            placement = _call(actor.build, config, model_path)
        except BaseException:
            ray.kill(actor)
            raise
        logger.info(
            "trainer actor on node %s, GPUs %s, device %s",
            placement["node_id"][:12],
            placement["gpu_ids"] or "none",
            placement["device"],
        )
        return cls(actor, placement)

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        return _call(self.actor.train_step, batch, step)

    def state_dict_for_engine(self) -> dict[str, Any]:
        """The weights copied into this process; the pipeline uses :meth:`engine_weight_refs` instead."""
        return _call(self.actor.state_dict_for_engine)

    def engine_weight_refs(self) -> list[Any]:
        """Refs to the weight buckets the actor packed and put in the object store itself."""
        return _call(self.actor.engine_weight_refs)

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        """Written by the actor on its node: with several nodes, ``output_dir`` must be a shared path."""
        _call(self.actor.save_checkpoint, str(directory), extra_state)

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        return _call(self.actor.load_checkpoint, str(directory))

    def run_sft(self, examples: list[Any], **kwargs: Any) -> dict[str, float]:
        return _call(self.actor.run_sft, examples, kwargs)

    def shutdown(self) -> None:
        """Kill the actor (idempotent)."""
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None


def _call(method: Any, *args: Any) -> Any:
    """``ray.get`` of an actor call, raising the actor's own exception rather than Ray's wrapper."""
    import ray

    try:
        return ray.get(method.remote(*args))
    except ray.exceptions.RayTaskError as exc:
        original = unwrap_ray_error(exc)
        if original is exc:
            raise
        raise original from None


# -- the placement decision, in one place ---------------------------------------------------


def build_placed_trainer(
    config: TrainerConfig, model_path: str, ensure_ray: Callable[[], None]
) -> TrainerHandle:
    """The configured trainer where ``trainer.placement`` says; ``ensure_ray`` starts or joins Ray when needed.

    ``trainer.strategy: fsdp2`` starts ``trainer.num_ranks`` rank actors in a placement
    group instead (:class:`~roll_async.trainer.ranks.rank_group.TrainerRankGroup`), whatever
    the placement. ``trainer.placement: driver`` (default) builds the trainer in the pipeline's
    process, as before. ``trainer.placement: ray_actor`` builds it inside a
    :class:`TrainerActor` created with ``num_gpus=trainer.num_gpus`` and one CPU, so
    on a cluster Ray puts the trainer on a node with a free GPU and assigns it one;
    the device is then chosen by :func:`~roll_async.trainer.grpo_trainer.resolve_device`
    from the GPUs Ray assigned (``trainer.device`` still wins when set explicitly).
    Every kind returned is a :class:`~roll_async.trainer.base.TrainerHandle`, so the
    pipeline's code is the same for every placement, and this is the one place the
    placement is decided: ``engine_weight_refs`` packs and puts the weights in the
    process holding the trainer (with an actor they go trainer -> object store ->
    engine replicas, never through the driver), ``run_sft`` runs where the model is,
    and ``shutdown`` stops the actor or ranks at the end of the run.
    """
    if trainer_needs_ray(config):
        ensure_ray()
    if config.strategy == "fsdp2":
        return TrainerRankGroup.start(config, model_path)
    if config.placement == "ray_actor":
        return TrainerActorClient.start(config, model_path)
    if config.simulate_step_s > 0:
        return SimulatedTrainer(config, model_path)
    return InProcessTrainer(build_model_trainer(config, model_path))


def trainer_needs_ray(config: TrainerConfig) -> bool:
    """The trainer lives in Ray actors (fsdp2 ranks, or ``placement: ray_actor``), so Ray must be up first."""
    return config.strategy == "fsdp2" or config.placement == "ray_actor"
