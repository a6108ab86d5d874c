"""One SPMD trainer rank: a Ray actor holding this rank's shards of the GRPO trainer.

Every method is called on all ranks at once by
:class:`~roll_async.trainer.ranks.rank_group.TrainerRankGroup` with the same
arguments; collectives inside keep the ranks in step, and the main rank's
return value is the group's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from roll_async.config.sections import TrainerConfig
from roll_async.engine.weight_transport import DEFAULT_BUCKET_BYTES, iter_weight_buckets
from roll_async.errors import LifecycleError
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.factory import loading_the_model
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.parallel.process_group import free_port, init_rank, leave_group
from roll_async.trainer.sft import run_sft


class TrainerRank:
    """Hosts one rank; created unconfigured, then :meth:`join` builds its process group and trainer."""

    def __init__(self) -> None:
        self.trainer: GRPOTrainer | None = None

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port: the group meets at rank 0's."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def join(
        self,
        rank: int,
        world_size: int,
        address: tuple[str, int],
        config: TrainerConfig,
        model_path: str,
    ) -> dict[str, Any]:
        """Join the group, then load and shard the model; return where this rank runs."""
        import ray

        gpu_ids = ray.get_gpu_ids()
        device = torch.device("cuda", 0) if gpu_ids else torch.device("cpu")
        info = init_rank(rank, world_size, address[0], address[1], device)
        with loading_the_model(model_path):
            self.trainer = GRPOTrainer(
                dataclasses.replace(config, device=str(device)), model_path, rank=info
            )
        context = ray.get_runtime_context()
        return {
            "rank": rank,
            "node_id": context.get_node_id(),
            "gpu_ids": [str(g) for g in gpu_ids],
            "device": str(device),
            "pid": os.getpid(),
        }

    def _trainer(self) -> GRPOTrainer:
        if self.trainer is None:
            raise LifecycleError("TrainerRank.join was not called")
        return self.trainer

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        return self._trainer().train_step(batch, step)

    def compute_logprobs(self, batch: TrajectoryBatch) -> torch.Tensor:
        return self._trainer().compute_logprobs(batch)

    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        return self._trainer().state_dict_for_engine()

    def engine_weight_refs(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Any]:
        """Gather unit by unit; the main rank packs and ``ray.put``s each bucket as it fills ([] elsewhere).

        The main rank holds at most one bucket and one gathered unit at a time.
        """
        import ray

        chunks = self._trainer().engine_weight_chunks()
        named = (item for chunk in chunks for item in chunk.items())
        return [ray.put(bucket) for bucket in iter_weight_buckets(named, bucket_bytes)]

    def save_checkpoint(self, directory: str, extra_state: dict[str, Any]) -> None:
        self._trainer().save_checkpoint(directory, extra_state)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        return self._trainer().load_checkpoint(directory)

    def run_sft(self, examples: list[Any], kwargs: dict[str, Any]) -> dict[str, float]:
        return run_sft(self._trainer(), examples, **kwargs)

    def memory(self) -> dict[str, int]:
        return self._trainer().memory()

    def leave(self) -> None:
        leave_group()
