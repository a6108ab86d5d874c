"""The fsdp2 trainer as the pipeline sees it: N rank actors in one placement group behind the Trainer methods.

Every peer that trains on Ray runs one SPMD actor per device in a placement
group; this is that, driven like the single trainer actor, so the pipeline's
code does not change with the strategy. A call goes to every rank with the same
arguments (a batch is put in the object store once and read by each rank) and
returns the main rank's answer. If one rank fails while the others wait in a
collective, the group cannot continue: it is stopped and the rank's error raised.
If no rank fails but some never answer (hung outside a collective, where
torch.distributed's timeout does not reach), ``trainer.rank_call_timeout_s``
bounds the call the same way.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from roll_async.config.sections import TrainerConfig
from roll_async.errors import ConfigError, TrainerRankTimeoutError
from roll_async.runtime.ray_utils import unwrap_ray_error
from roll_async.trainer.base import TrainerHandle
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.ranks.rank_actor import TrainerRank

logger = logging.getLogger(__name__)

#: CPUs each rank reserves (it computes; it should not share its core with an env worker).
RANK_CPUS = 1
#: How long the placement group may wait for its resources before the run fails instead of hanging.
PLACEMENT_TIMEOUT_S = 120.0
#: After one rank fails, how long the others get to fail or finish before the group is stopped.
PEER_GRACE_S = 30.0


def check_cluster_fits(config: TrainerConfig, resources: dict[str, float]) -> None:
    """One-line ConfigError when the Ray cluster lacks the CPUs or GPUs the ranks ask for."""
    ranks = config.num_ranks
    wanted_gpus = ranks * config.gpus_per_rank
    have_gpus = float(resources.get("GPU", 0.0))
    if wanted_gpus > have_gpus:
        raise ConfigError(
            f"trainer.num_ranks={ranks} x trainer.gpus_per_rank={config.gpus_per_rank:g} needs {wanted_gpus:g} "
            f"GPU(s) but the Ray cluster has {have_gpus:g}; lower trainer.num_ranks, set gpus_per_rank=0 for CPU "
            "ranks, or join a larger cluster (ray_address)"
        )
    have_cpus = float(resources.get("CPU", 0.0))
    if ranks * RANK_CPUS > have_cpus:
        raise ConfigError(
            f"trainer.num_ranks={ranks} needs {ranks * RANK_CPUS} CPU(s), one per rank, but the Ray cluster has "
            f"{have_cpus:g}; lower trainer.num_ranks or raise ray_num_cpus"
        )


class TrainerRankGroup(TrainerHandle):
    """The pipeline's handle on the fsdp2 ranks: the TrainerHandle methods, each run on every rank."""

    #: A real trainer (validation keeps the simulated one out of fsdp2).
    simulated = False

    def __init__(
        self,
        actors: list[Any],
        group: Any,
        placements: list[dict[str, Any]],
        call_timeout_s: float = TrainerConfig.rank_call_timeout_s,
    ) -> None:
        self.actors = actors
        self.group = group
        #: Per rank: rank, node_id, gpu_ids, device, pid.
        self.placements = placements
        #: trainer.rank_call_timeout_s: how long one call may wait on the ranks (0: forever).
        self.call_timeout_s = call_timeout_s

    @classmethod
    def start(cls, config: TrainerConfig, model_path: str) -> TrainerRankGroup:
        """Reserve one bundle per rank (packed onto as few nodes as hold them), start the ranks, join them."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        check_cluster_fits(config, ray.cluster_resources())
        bundle: dict[str, float] = {"CPU": RANK_CPUS}
        if config.gpus_per_rank > 0:
            bundle["GPU"] = config.gpus_per_rank
        group = placement_group(
            [dict(bundle) for _ in range(config.num_ranks)], strategy="PACK"
        )
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(group)
            raise ConfigError(
                f"trainer.num_ranks={config.num_ranks}: Ray could not place {config.num_ranks} rank(s) of {bundle} "
                f"within {PLACEMENT_TIMEOUT_S:g} s (resources taken by other actors?); lower trainer.num_ranks "
                "or free resources"
            )
        actors = [
            ray.remote(TrainerRank)
            .options(
                num_cpus=RANK_CPUS,
                num_gpus=config.gpus_per_rank,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
                # each rank computes on its own core(s); torch must not start more threads than it has
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(RANK_CPUS)}},
            )
            .remote()
            for index in range(config.num_ranks)
        ]
        handle = cls(actors, group, [], config.rank_call_timeout_s)
        try:
            # start-up has the call deadline too: a rank that never comes up, or hangs loading the model in
            # join, must not hang the run
            (address,) = handle._each(
                "rendezvous_address", [actors[0].rendezvous_address.remote()]
            )
            handle.placements = handle._each(
                "join",
                [
                    actor.join.remote(
                        rank, config.num_ranks, address, config, model_path
                    )
                    for rank, actor in enumerate(actors)
                ],
            )
        except BaseException:
            handle.shutdown()
            raise
        nodes = {p["node_id"] for p in handle.placements}
        logger.info(
            "trainer: %d fsdp2 rank(s) on %d node(s), devices %s",
            config.num_ranks,
            len(nodes),
            ", ".join(p["device"] for p in handle.placements),
        )
        return handle

    # -- running a call on every rank ----------------------------------------------------

    def _each(self, method: str, refs: list[Any]) -> list[Any]:
        """Every rank's result of ``method``, in rank order; a rank error, or ranks silent past the deadline, stop the group.

        ``refs[i]`` is rank i's call. The first rank error is raised once the others have finished or had
        PEER_GRACE_S (they may be stuck in a collective waiting for it); it wins over the deadline, being the
        cause. With no error, ranks that have not answered within ``call_timeout_s`` are hung where no
        collective timeout reaches them: the group is stopped and TrainerRankTimeoutError names them.
        """
        import ray

        started = time.monotonic()
        call_deadline = (
            started + self.call_timeout_s if self.call_timeout_s > 0 else None
        )
        pending = list(refs)
        grace_deadline: float | None = None
        failure: BaseException | None = None
        while pending:
            deadlines = [d for d in (call_deadline, grace_deadline) if d is not None]
            timeout = max(min(deadlines) - time.monotonic(), 0.0) if deadlines else None
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:
                break  # past the call's deadline, or the grace after a failure
            try:
                ray.get(done[0])
            except ray.exceptions.RayError as exc:
                if failure is None:
                    failure = (
                        unwrap_ray_error(exc)
                        if isinstance(exc, ray.exceptions.RayTaskError)
                        else exc
                    )
                    grace_deadline = time.monotonic() + PEER_GRACE_S
        if failure is not None:
            if pending:
                logger.error(
                    "a trainer rank failed and the others are stuck in a collective: stopping the ranks"
                )
                self.shutdown()
            raise failure
        if pending:
            waited = time.monotonic() - started
            num_ranks = len(self.actors)
            silent = set(pending)
            ranks = [rank for rank, ref in enumerate(refs) if ref in silent]
            located = {
                p["rank"]: f"rank {p['rank']}: node {p['node_id']}, pid {p['pid']}"
                for p in self.placements
            }
            logger.error(
                "trainer ranks %s did not answer %s within %.1f s (%s): stopping the ranks",
                ranks,
                method,
                waited,
                "; ".join(located[rank] for rank in ranks if rank in located)
                or "not joined yet",
            )
            self.shutdown()
            raise TrainerRankTimeoutError(method, ranks, num_ranks, waited)
        return ray.get(refs)

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._each(
            method, [getattr(actor, method).remote(*args) for actor in self.actors]
        )

    # -- the TrainerHandle methods -------------------------------------------------------------

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        import ray

        return self._all("train_step", ray.put(batch), step)[0]

    def compute_logprobs(self, batch: TrajectoryBatch) -> Any:
        import ray

        return self._all("compute_logprobs", ray.put(batch))[0]

    def state_dict_for_engine(self) -> dict[str, Any]:
        """The whole model gathered into this process: for tests; syncs use :meth:`engine_weight_refs`."""
        return self._all("state_dict_for_engine")[0]

    def engine_weight_refs(self) -> list[Any]:
        """Refs to the buckets the main rank put while the ranks gathered the weights unit by unit."""
        return self._all("engine_weight_refs")[0]

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        """Each rank writes its DCP shards; with several nodes ``output_dir`` must be a shared path."""
        self._all("save_checkpoint", str(directory), extra_state)

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        return self._all("load_checkpoint", str(directory))[0]

    def run_sft(self, examples: list[Any], **kwargs: Any) -> dict[str, float]:
        return self._all("run_sft", examples, kwargs)[0]

    def memory(self) -> list[dict[str, int]]:
        """Per rank: the parameter and optimizer-state bytes it holds."""
        return self._all("memory")

    def shutdown(self) -> None:
        """Kill the ranks and release their placement group (idempotent)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
