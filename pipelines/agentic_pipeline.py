"""AgenticPipeline: rollout → train → weight sync, one loop for sync and async mode.

    for step in steps:
        batch = source.next_batch(step)          # rollout (blocks) or replay.from
        trainer.train_step(batch, step)          # never cut short by a signal
        for action in after_step:                # in order:
            WeightSync, Validation, CheckpointAndExport, StepLog

The batch sources are in ``batch_sources.py``, the train step in ``train_step.py`` and
the after-step actions in ``step_actions.py``; :meth:`AgenticPipeline._phase` is where
a phase is raced against a signal, and ``_run`` is where an interrupt ends the run.
In sync mode the scheduler has suspended the env loops when ``get_batch`` returns; in
async mode they keep generating with version ``step``, and groups older than
max_staleness steps are dropped by the scheduler.

The mode flag changes only scheduler behaviour (inside RolloutScheduler) and the
weight-sync policy (``_sync_weights``); everything else is the same code.
Weight versions count optimizer steps on top of the engine's version at start
(0 for a fresh engine): after training on step s the engine serves
``base + s + 1``, so versions rise by one each step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.engine.replica_fleet import EngineReplicaFleet
from roll_async.errors import ConfigError
from roll_async.model.export import export_checkpoint
from roll_async.pipelines.batch_sources import BatchSource, ReplaySource, RolloutSource
from roll_async.pipelines.env_runs import end_env_runs, label_env_runs, new_run_id
from roll_async.pipelines.frozen_engines import (
    launch_frozen_engines,
    shutdown_frozen_engines,
)
from roll_async.pipelines.interrupt import InterruptFlag, RunInterrupted, SignalReceived
from roll_async.pipelines.preflight import import_user_code, preflight, used_tags
from roll_async.pipelines.snapshot_engines import (
    SnapshotWeights,
    engine_lora_serving,
    launch_snapshot_engines,
    shutdown_snapshot_engines,
)
from roll_async.pipelines.step_actions import (
    CheckpointAndExport,
    StepAction,
    StepLog,
    Validation,
    WeightSync,
)
from roll_async.pipelines.step_state import RunProgress
from roll_async.pipelines.train_step import TrainStep
from roll_async.prompts.images import input_only_logit_bias
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.rewards.reward_services import (
    RewardService,
    launch_reward_services,
    shutdown_reward_services,
)
from roll_async.run_output.logs import attach_run_logs, configure_console
from roll_async.run_output.run_dir import RunDirectory
from roll_async.run_output.tracking import MetricsTracker
from roll_async.runtime.ray_utils import init_ray
from roll_async.sampling import SamplingSettings
from roll_async.scheduler.interface import RolloutScheduling
from roll_async.scheduler.rollout_scheduler import RolloutScheduler
from roll_async.scheduler.validation import ValidationScheduler
from roll_async.trainer import checkpoint_dir, prune_checkpoints
from roll_async.trainer.base import TrainerHandle
from roll_async.trainer.batch_dump import saved_steps
from roll_async.trainer.collate import padding_token_id
from roll_async.trainer.factory import ModelLoadError
from roll_async.trainer.sft import build_sft_examples
from roll_async.trainer.trainer_actor import build_placed_trainer, trainer_needs_ray

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AgenticPipeline:
    """Owns the engines, schedulers and trainer of one training run."""

    def __init__(
        self,
        config: PipelineConfig,
        engines: list[Any] | None = None,
        reward_services: Mapping[str, RewardService] | None = None,
        opponent_engines: Mapping[str, list[Any]] | None = None,
    ) -> None:
        """``engines``: running engine actors to use instead of launching (tests, notebooks); not shut down here.
        ``reward_services``: likewise, running judges / reward models by tag instead of launching them.
        ``opponent_engines``: likewise, the engines of ``frozen:`` seats by model path."""
        self.config = config
        self.engines: list[Any] = list(engines or [])
        self._owns_engines = not self.engines
        #: tag -> the judge / reward model scoring that tag's episodes (custom_envs.<Tag>.reward); never weight-synced.
        self.reward_services: dict[str, RewardService] = dict(reward_services or {})
        self._owns_reward_services = reward_services is None
        #: frozen: seat model path -> its engines (custom_envs.<Tag>.seats); never weight-synced.
        self.opponent_engines: dict[str, list[Any]] = dict(opponent_engines or {})
        self._owns_opponent_engines = opponent_engines is None
        #: A full-weight run's policy snapshots: lag k -> its engine (pipelines/snapshot_engines.py); {} with LoRA.
        self.snapshot_engines: dict[int, list[Any]] = {}
        self.snapshots = SnapshotWeights({})
        self.fleet = EngineReplicaFleet(self.engines)
        self._owns_ray = False
        self.version_base = 0
        self.train_scheduler: RolloutScheduling | None = None
        self.val_scheduler: ValidationScheduler | None = None
        self.trainer: TrainerHandle | None = None
        self.tokenizer: ChatTokenizer | None = None
        self.model_path = ""
        self.start_step = 0
        self.resumed_seed_state: dict[str, Any] | None = None
        #: The game ratings (Elo against snapshots) of the checkpoint resumed from.
        self.resumed_ratings: dict[str, Any] | None = None
        self.run_dir: RunDirectory | None = None
        self.tracker: MetricsTracker | None = None
        #: Set by SIGINT/SIGTERM when run(handle_signals=True); see roll_async.pipelines.interrupt.
        self.interrupt = InterruptFlag()
        #: replay.from: step -> saved batch file; no engine, env or Ray when set.
        self.replay_steps: dict[int, Path] | None = None
        #: Labels what the run's envs hold outside their processes (containers); set when the actors start.
        self.run_id = ""
        self._run_swept = False

    # -- set-up ------------------------------------------------------------------------

    def _preflight(self) -> None:
        """Check the config, model, tokenizer and envs (roll_async.pipelines.preflight); nothing starts."""
        config = self.config
        self.model_path, self.tokenizer = preflight(config)
        # The distribution train rollouts sample from, engine-side logit bias included (the trainer scores under it).
        self.train_sampling = SamplingSettings.from_generation(
            config.generation, input_only_logit_bias(self.model_path)
        )

    def _prepare_trainer(self) -> dict[str, float]:
        """Build the trainer, resume or warm start it; all before any engine or env actor exists.

        A trainer in Ray actors (fsdp2 ranks, ``placement: ray_actor``) needs Ray: ``run`` starts it on
        the loop's thread first (:meth:`_ensure_ray`), since this runs in a worker thread.
        """
        config = self.config
        if self.tokenizer is None:
            self._preflight()
        try:
            self.trainer = build_placed_trainer(
                config.trainer, self.model_path, ensure_ray=self._ensure_ray
            )
        except ModelLoadError as exc:
            # only an error reading the model's files; anything else (Ray, ranks, a timeout) is itself
            raise ConfigError(
                f"model.path={config.model.path!r}: the trainer {exc}"
            ) from None
        if config.checkpoint.resume_from:
            extra = self.trainer.load_checkpoint(config.checkpoint.resume_from)
            self.start_step = int(extra["step"]) + 1
            self.resumed_seed_state = extra.get("scheduler_seed_state")
            self.resumed_ratings = extra.get("pool_ratings")
            logger.info(
                "resumed from %s at step %d",
                config.checkpoint.resume_from,
                self.start_step,
            )
            return {}
        if not config.sft_warmup.enabled:
            return {}
        warm = config.sft_warmup
        tag = config.train_env_manager.tags[0]
        spec = config.custom_envs[tag]
        assert self.tokenizer is not None  # set by _preflight above
        examples = build_sft_examples(
            spec.env_type,
            dict(spec.env_config),
            # disjoint from rollout seeds
            seeds=[config.seed * 1000 + 7919 + i for i in range(warm.num_demos)],
            tokenizer=self.tokenizer,
            system_prompt=spec.system_prompt,
            instruction_template=spec.instruction_template,
            observation_template=spec.observation_template,
            demo_fraction=warm.demo_fraction,
            max_length=config.sequence_length,
            demonstrator=warm.demonstrator,
        )
        if not examples:
            raise ConfigError(
                f"sft_warmup: the expert of custom_envs.{tag} solved none of {warm.num_demos} seeds"
            )
        sft_metrics = self.trainer.run_sft(
            examples,
            steps=warm.steps,
            lr=warm.lr,
            batch_size=warm.batch_size,
            pad_token_id=padding_token_id(self.tokenizer),
            seed=config.seed,
        )
        logger.info("SFT warm start: %s", sft_metrics)
        return sft_metrics

    def _ensure_ray(self) -> None:
        """Start or join Ray once per run (a trainer actor needs it before the engines start).

        Called on the loop's thread: there ``ray.init`` replaces the SIGTERM handler and ``reclaim`` takes
        it back at once (from a worker thread Ray would leave the handlers alone but warn on the console).
        """
        import ray

        if not ray.is_initialized():
            self._owns_ray = True
            config = self.config
            init_ray(
                config.ray_address,
                config.ray_num_cpus,
                log_dir=self.run_dir.logs if self.run_dir else None,
            )
            self.interrupt.reclaim()  # ray.init replaced the SIGTERM handler

    async def _start_actors(self) -> None:
        config = self.config
        self._ensure_ray()
        lora = engine_lora_serving(config, self.model_path)
        if self._owns_engines:
            self.engines = await launch_engines(
                self.model_path, config.engine, lora=lora
            )
        if self._owns_reward_services:
            self.reward_services = await launch_reward_services(
                config.custom_envs, used_tags(config)
            )
        if self._owns_opponent_engines:
            self.opponent_engines = await launch_frozen_engines(
                config, used_tags(config)
            )
        # full weights: each snapshot lag on an engine of its own, loaded by self.snapshots
        if lora is None:
            self.snapshot_engines = await launch_snapshot_engines(
                config, self.model_path, used_tags(config)
            )
            self.snapshots = SnapshotWeights(self.snapshot_engines)
        # weight syncs go on when a replica dies; frozen opponents' and snapshots' engines are not in it
        self.fleet = EngineReplicaFleet(self.engines)
        # Step s rolls out with version base + s; a fresh engine (version 0) gives base 0, so
        # versions equal steps. A caller's engine may already be further on.
        engine_version = await self.fleet.weight_version()
        self.version_base = max(0, engine_version - self.start_step)
        if (
            config.checkpoint.resume_from
            or config.sft_warmup.enabled
            or not self._owns_engines
        ):
            # The engine holds other weights (the base model, or a caller's); give it the trainer's.
            await self._push_weights(
                version=self.version_base + self.start_step,
                in_flight="wait",
                start=True,
            )
        assert self.run_dir is not None
        self.run_id = new_run_id(self.run_dir.root.name)
        label_env_runs(config, self.run_id)
        self.train_scheduler = RolloutScheduler(
            rollout_spec(config, "train"),
            engine_handles=self.engines,
            tokenizer_path=self.model_path,
            start_step=self.start_step,
            version_base=self.version_base,
            seed_state=self.resumed_seed_state,
            reward_services=self.reward_services,
            opponent_engines=self.opponent_engines,
            snapshot_engines=self.snapshot_engines,
            ratings_state=self.resumed_ratings,
        )
        if config.eval_steps > 0 and config.val_env_manager.num_env_groups > 0:
            val_spec = rollout_spec(config, "val")
            self.val_scheduler = ValidationScheduler.for_spec(
                val_spec,
                RolloutScheduler(
                    val_spec,
                    engine_handles=self.engines,
                    tokenizer_path=self.model_path,
                    reward_services=self.reward_services,
                    opponent_engines=self.opponent_engines,
                    snapshot_engines=self.snapshot_engines,
                ),
            )

    # -- weight sync -------------------------------------------------------------------

    async def _push_weights(
        self, version: int, in_flight: str, start: bool = False
    ) -> float:
        """Pause every replica (``in_flight`` decides what happens to running turns), load, resume; then the
        snapshot engines (``start``: the run's start weights, for all of them). A simulated trainer pushes
        no buckets: its snapshot engines keep the model path's weights and version (never trained on)."""
        began = time.perf_counter()
        assert self.trainer is not None
        if self.trainer.simulated:
            await self._push_simulated_version(version, in_flight)
            return time.perf_counter() - began

        # Packed once and put in the object store once for every replica (not one pickled copy per replica),
        # by the process holding the trainer (a trainer actor's weights never pass through the driver).
        buckets = await asyncio.to_thread(self.trainer.engine_weight_refs)
        await self.fleet.push_weights(buckets, version, in_flight)
        await (self.snapshots.load_start if start else self.snapshots.push)(
            buckets, version
        )
        return time.perf_counter() - began

    async def _push_simulated_version(self, version: int, in_flight: str) -> None:
        """trainer.simulate_step_s: pause as for a real sync, take simulate_sync_s, advance the version, resume."""
        await self.fleet.push_simulated_version(
            version, in_flight, self.config.trainer.simulate_sync_s
        )

    async def _sync_weights(self, step: int) -> float:
        """After training on ``step``: the engine gets version step + 1 (or keeps its version between intervals)."""
        if (
            self.replay_steps is not None
            or (step + 1) % self.config.weight_sync.interval != 0
        ):
            return 0.0
        # Sync mode: the loops are suspended and nothing is in flight, so "wait" returns at once.
        # Async mode: the configured policy; aborted turns are continued by the EnvManagers.
        in_flight = (
            "wait" if self.config.mode == "sync" else self.config.weight_sync.in_flight
        )
        return await self._push_weights(self.version_base + step + 1, in_flight)

    # -- the loop ------------------------------------------------------------------------

    async def _checkpoint(self, step: int) -> None:
        assert self.run_dir is not None
        seed_state = None
        if self.train_scheduler is not None:
            seed_state = await asyncio.wait_for(
                self.train_scheduler.seed_state(), timeout=30.0
            )
        extra_state = {
            "step": step,
            "scheduler_seed_state": seed_state,
            "pool_ratings": self.train_scheduler.ratings.state()
            if self.train_scheduler is not None
            else None,
        }
        path = checkpoint_dir(self.run_dir.checkpoints, step)
        assert self.trainer is not None
        await asyncio.to_thread(self.trainer.save_checkpoint, path, extra_state)
        prune_checkpoints(self.run_dir.checkpoints, self.config.checkpoint.keep_last)

    def _export_hf(self, step: int) -> None:
        """checkpoint.export_hf_interval: the step's checkpoint as a Hugging Face model in RUN_DIR/hf/step_N."""
        assert self.run_dir is not None
        out = self.run_dir.root / "hf" / f"step_{step}"
        if out.exists():
            logger.info(
                "%s exists (an earlier run of this step): not exported again", out
            )
            return
        export_checkpoint(self.run_dir.root, out, step)
        logger.info("step %d exported as a Hugging Face model: %s", step, out)

    async def _validate(self, step: int) -> dict[str, float]:
        if self.val_scheduler is None:
            return {}
        val_metrics: dict[str, float]
        _, val_metrics = await self.val_scheduler.evaluate(step)
        return val_metrics

    async def _interrupted(self, progress: RunProgress) -> RunInterrupted:
        """A signal stopped the run: checkpoint the last completed step; the error the run ends with."""
        assert self.run_dir is not None
        checkpoint = await self._checkpoint_on_interrupt(
            progress.last_completed, progress.last_saved
        )
        return RunInterrupted(
            progress.last_completed + 1,
            str(self.run_dir.root),
            checkpoint,
            self.interrupt.signal_name,
        )

    async def _checkpoint_on_interrupt(
        self, last_completed: int, last_saved: int
    ) -> str | None:
        """The checkpoint of the last completed step (saved now unless it already was); None before any step."""
        assert self.run_dir is not None
        if last_completed > last_saved:
            try:
                await self._checkpoint(last_completed)
            except Exception as exc:  # the scheduler may be gone (e.g. its worker got the signal too): keep the weights
                logger.warning(
                    "checkpoint with scheduler state failed (%s); saving the trainer state alone",
                    exc,
                )
                self.train_scheduler = None
                await self._checkpoint(last_completed)
            last_saved = last_completed
        if last_saved < self.start_step:
            return None
        return str(checkpoint_dir(self.run_dir.checkpoints, last_saved))

    async def run(self, handle_signals: bool = False) -> Path:
        """Train; ``handle_signals``: the first SIGINT/SIGTERM stops at a safe point and raises RunInterrupted."""
        if handle_signals:
            self.interrupt.install()
        try:
            return await self._run()
        finally:
            self.interrupt.uninstall()

    async def _run(self) -> Path:
        """The run: set up, then per step its batch, the train step and the after-step actions, in order."""
        config = self.config
        trainer = await self._set_up()
        progress_bar = _progress_bar(config, self.start_step)
        progress = RunProgress(self.start_step)
        interrupted: RunInterrupted | None = None
        try:
            source = await self._open_batch_source()
            if config.eval_at_start and config.eval_steps > 0:
                # the start value, on the episodes every later validation plays (before any RL step)
                start_metrics = await self._phase(True, self._validate(self.start_step))
                assert self.tracker is not None
                self.tracker.log(self.start_step - 1, start_metrics)
            train_step = TrainStep(trainer, progress)
            after_step = self._after_step_actions(progress, progress_bar)
            for step in range(self.start_step, config.max_steps):
                record = await self._phase(
                    source.interruptible, source.next_batch(step, time.perf_counter())
                )
                if record is None:
                    break
                await source.save(record)
                await train_step(record)
                # A signal during the train step: the step is trained (and checkpointed on the way out),
                # so its record is still written; the other after-step actions are skipped.
                record.stopping = self.interrupt.is_set
                for action in after_step:
                    if action.due(record) and (
                        action.runs_when_stopping or not record.stopping
                    ):
                        await self._phase(action.interruptible, action(record))
                if record.stopping:
                    raise SignalReceived(self.interrupt.signal_name)
        except SignalReceived:
            interrupted = await self._interrupted(progress)
        finally:
            if progress_bar is not None:
                progress_bar.close()
            await self.shutdown()
        if interrupted is not None:
            raise interrupted
        assert self.run_dir is not None
        print(f"run directory: {self.run_dir.root}")
        return self.run_dir.root

    async def _set_up(self) -> TrainerHandle:
        """Preflight, the run directory, the trainer (resumed or warm-started) and the metrics tracker."""
        config = self.config
        configure_console(config.logging.level)
        if config.replay.from_dir:
            self.replay_steps = saved_steps(config.replay.from_dir)
        # User modules are imported here, on the loop's (main) thread, where one that sets a signal handler at
        # import time can, and gets roll-async's Ctrl-C handling put back; in preflight's thread it could not.
        import_user_code(config)
        await self.interrupt.race(asyncio.to_thread(self._preflight))
        # Before the trainer: ranks or a trainer actor start Ray, whose workers log into RUN_DIR/logs.
        self.run_dir = RunDirectory.create(config.output_dir, f"train-{config.mode}")
        self.run_dir.write_config(config)
        attach_run_logs(self.run_dir.root, config.logging.level)
        try:
            if trainer_needs_ray(config.trainer):
                self._ensure_ray()
            sft_metrics = await self.interrupt.race(
                asyncio.to_thread(self._prepare_trainer)
            )
        except BaseException:
            # the ranks or trainer actor, and Ray, if they started
            await self.shutdown()
            raise
        self.tracker = MetricsTracker(
            config.logging, self.run_dir, dataclasses.asdict(config)
        )
        if sft_metrics:
            self.tracker.log(self.start_step - 1, sft_metrics)
        assert self.trainer is not None
        return self.trainer

    # -- the loop's phases ---------------------------------------------------------------

    async def _phase(self, interruptible: bool, work: Awaitable[T]) -> T:
        """Every phase is awaited here: an interruptible one is raced against the first signal."""
        return await (self.interrupt.race(work) if interruptible else work)

    async def _open_batch_source(self) -> BatchSource:
        """replay.from: the saved batches (nothing starts); otherwise start the actors and roll out."""
        config = self.config
        if self.replay_steps is not None:
            assert config.replay.from_dir  # the steps were read from it
            return ReplaySource(self.replay_steps, config.replay.from_dir)
        await self.interrupt.race(self._start_actors())
        assert self.run_dir is not None and self.train_scheduler is not None
        return RolloutSource(
            self.train_scheduler,
            pad_token_id=padding_token_id(self.tokenizer),
            sampling=self.train_sampling,
            version_base=self.version_base,
            save_to=self.run_dir.batches if config.logging.save_batches else None,
        )

    def _after_step_actions(
        self, progress: RunProgress, progress_bar: Any
    ) -> list[StepAction]:
        """What follows each train step, in this order (docs/architecture.md)."""
        config = self.config
        assert self.run_dir is not None and self.tracker is not None
        return [
            WeightSync(self._sync_weights),
            Validation(config.eval_steps, self._validate),
            CheckpointAndExport(
                config.checkpoint,
                config.max_steps,
                self._checkpoint,
                self._export_hf,
                progress,
            ),
            StepLog(
                config.logging,
                self.tracker,
                self.run_dir,
                self.tokenizer,
                self.fleet if self.engines else None,
                self.train_scheduler,
                progress_bar,
            ),
        ]

    async def shutdown(self) -> None:
        import ray

        for scheduler in (self.train_scheduler, self.val_scheduler):
            if scheduler is not None:
                await scheduler.shutdown()
        self.train_scheduler = self.val_scheduler = None
        if self.run_id and not self._run_swept:
            # every env closed with its scheduler: what the run's envs left behind is swept (and counted) now
            self._run_swept = True
            swept = await asyncio.to_thread(end_env_runs, self.config, self.run_id)
            if swept and self.tracker is not None:
                self.tracker.log(self.config.max_steps, swept)
        if self._owns_engines:
            await shutdown_engines(self.engines)
            self.engines = []
        if self._owns_reward_services:
            await shutdown_reward_services(self.reward_services)
            self.reward_services = {}
        if self._owns_opponent_engines:
            await shutdown_frozen_engines(self.opponent_engines)
            self.opponent_engines = {}
        await shutdown_snapshot_engines(self.snapshot_engines)
        self.snapshot_engines = {}
        if self.trainer is not None:
            self.trainer.shutdown()
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _progress_bar(config: PipelineConfig, start_step: int) -> Any:
    if not config.logging.progress_bar:
        return None
    from tqdm import tqdm

    return tqdm(
        total=config.max_steps,
        initial=start_step,
        desc=f"train ({config.mode})",
        unit="step",
    )


def run_train(config: PipelineConfig) -> Path:
    """The ``roll-async train`` entry: SIGINT/SIGTERM end the run with a checkpoint (RunInterrupted)."""
    return asyncio.run(AgenticPipeline(config).run(handle_signals=True))
