"""The built-in trainer: GRPO/RLOO advantages, clipped PPO loss with truncated importance sampling, AdamW.

A run needs a trainer that works out of the box on the same HF causal LM the
engine serves, on one device (CUDA when present, else CPU); custom trainers
plug in through :class:`~roll_async.trainer.base.Trainer` instead. This module
is the loss step alone; the model, its LoRA adapters, KL reference and AdamW are
held by :class:`~roll_async.trainer.policy_model.PolicyModel`, and checkpoints
are written by :mod:`roll_async.trainer.checkpoint`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from roll_async.config.sections import TrainerConfig
from roll_async.errors import ConfigError, NonFiniteLossError
from roll_async.metrics import (
    TRAIN_OPTIMIZER_STEPS,
    TRAIN_SKIPPED_MICRO_BATCHES,
    TRAIN_TOKEN_LAG_MASKED_FRACTION,
    TRAIN_TOKEN_LAG_MAX,
)
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.checkpoint import (
    load_trainer_checkpoint,
    save_trainer_checkpoint,
)
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.losses import (
    LossNormalizer,
    aggregate,
    clipped_surrogate,
    k3_kl,
    token_lag,
    truncated_importance_weights,
)
from roll_async.trainer.losses import scored_mask as _scored_mask
from roll_async.trainer.micro_batches import MicroBatch, plan_micro_batches
from roll_async.trainer.parallel.data_parallel import (
    all_ranks_agree,
    max_across_ranks,
    rank_share,
    sum_across_ranks,
)
from roll_async.trainer.parallel.process_group import RankInfo
from roll_async.trainer.policy_model import _DTYPES as _DTYPES  # re-exported
from roll_async.trainer.policy_model import PolicyModel, warmup_lr
from roll_async.trainer.policy_model import resolve_device as resolve_device

logger = logging.getLogger(__name__)


@dataclass
class GradientStats:
    """What one pass of :meth:`GRPOTrainer.accumulate_gradients` measured (sums already batch-normalised)."""

    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    importance_ratio_mean: float
    importance_ratio_max: float
    tis_truncated_fraction: float
    num_tokens: int
    #: Micro-batches with no scored token: not run forward or backward (nothing to learn from them).
    skipped_micro_batches: int
    #: Per-token log-probs of this pass ([batch, seq], detached): the proximal policy for later epochs.
    logprobs: torch.Tensor


@dataclass
class MicroBatchResult:
    """What one micro-batch contributed (its loss already backwarded); sums are over its scored tokens."""

    #: The micro-batch's row indices (a tensor on the trainer's device).
    rows: torch.Tensor
    #: Its log-probs ([rows, width], detached), for the batch's [batch, seq] log-probs.
    logprobs: torch.Tensor
    loss: float
    pg_loss: float
    kl: float
    num_tokens: int
    clipped: int
    truncated: int
    entropy_sum: float
    ratio_sum: float
    ratio_max: float


class GRPOTrainer:
    """The built-in :class:`~roll_async.trainer.base.Trainer`.

    It trains the same HF causal LM the engine serves, on one device (CUDA when
    present, else CPU). One ``train_step`` = ``ppo_epochs`` optimizer steps over the
    whole rollout batch, each accumulating gradients over micro-batches of
    ``micro_batch_size`` trajectories, or, with ``max_tokens_per_micro_batch``, of
    rows grouped by that token budget and run packed without padding
    (:mod:`roll_async.trainer.micro_batches`); the loss formula and the meaning of the
    three log-probabilities are in :mod:`roll_async.trainer.losses`.

    ``trainer.max_token_lag`` (off by default) drops from the loss every token
    whose weight version (``TrajectoryBatch.token_versions``) lags the batch's
    ``policy_version`` by more than the bound; the loss is averaged over the tokens
    kept, and ``train/token_lag/masked_fraction`` reports the share dropped.

    Dropout is switched off: the PPO ratio and the importance weights compare the
    same policy across passes, which random masks would break.

    The model, its precision, LoRA adapters, KL reference and AdamW are held by
    :attr:`policy` (:class:`~roll_async.trainer.policy_model.PolicyModel`).
    ``rank`` (trainer.strategy fsdp2, built by roll_async.trainer.ranks): this
    process is one SPMD rank; it runs its share of the micro-batch plan and the
    batch sums are added up across ranks (roll_async.trainer.parallel).
    """

    def __init__(
        self,
        config: TrainerConfig,
        model_path: str | os.PathLike[str],
        *,
        trust_remote_code: bool = False,
        tokenizer: ChatTokenizer | None = None,
        rank: RankInfo | None = None,
    ) -> None:
        if config.ppo_epochs < 1:
            raise ConfigError(f"trainer.ppo_epochs={config.ppo_epochs}: must be >= 1")
        if config.micro_batch_size < 1:
            raise ConfigError(
                f"trainer.micro_batch_size={config.micro_batch_size}: must be >= 1"
            )
        if config.max_tokens_per_micro_batch < 0:
            raise ConfigError(
                f"trainer.max_tokens_per_micro_batch={config.max_tokens_per_micro_batch}: must be >= 0 "
                "(0: trainer.micro_batch_size rows per pass)"
            )
        self.config = config
        #: The model, its reference and AdamW (loading, fsdp2 sharding, LoRA): what the loss step trains.
        self.policy = PolicyModel(
            config,
            model_path,
            trust_remote_code=trust_remote_code,
            tokenizer=tokenizer,
            rank=rank,
        )
        self.model_path = self.policy.model_path
        #: This process's place among the fsdp2 ranks; None for the single strategy.
        self.rank = rank
        self.device = self.policy.device
        #: Master weights and AdamW state: always float32 (see trainer.param_dtype for the compute dtype).
        self.dtype = self.policy.dtype
        #: trainer.lora.rank > 0: the model is a peft model whose adapters alone train.
        self.lora = self.policy.lora
        self.optimizer_steps = 0
        self.last_step: int | None = None

    # -- the holder's parts, under the names callers use --------------------------------

    @property
    def model(self) -> Any:
        """The policy being trained (a peft model with LoRA; FSDP2-sharded under fsdp2)."""
        return self.policy.model

    @property
    def ref_model(self) -> Any:
        """The KL reference (None when kl_coef is 0; the model itself, adapters off, with LoRA)."""
        return self.policy.ref_model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.policy.optimizer

    @property
    def tokenizer(self) -> ChatTokenizer | None:
        return self.policy.tokenizer

    @property
    def packing(self) -> bool:
        """Micro-batches run packed (rows end to end, no padding)."""
        return self.policy.packing

    @property
    def reference_source(self) -> str:
        """``initial`` (model.path's weights) or ``snapshot`` (after reset_reference)."""
        return self.policy.reference_source

    @property
    def compute_dtype(self) -> torch.dtype:
        """Forward/backward compute dtype (torch.autocast when not float32)."""
        return self.policy.compute_dtype

    @compute_dtype.setter
    def compute_dtype(self, dtype: torch.dtype) -> None:
        self.policy.compute_dtype = dtype

    # -- training ----------------------------------------------------------------------

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        """``ppo_epochs`` optimizer steps on ``batch``; raises NonFiniteLossError before a bad step."""
        cfg = self.config
        batch = batch.to(self.device)
        advantages = compute_advantages(
            batch.rewards.float(),
            batch.group_index,
            cfg.advantage_estimator,
            normalize_std=cfg.normalize_advantage_std,
        )
        normalizer = LossNormalizer.for_mask(self._loss_mask(batch))
        for group in self.optimizer.param_groups:
            group["lr"] = warmup_lr(cfg.lr, cfg.lr_warmup_steps, step)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        proximal: torch.Tensor | None = None
        epochs: list[GradientStats] = []
        grad_norms: list[float] = []
        for epoch in range(cfg.ppo_epochs):
            where = f"epoch {epoch + 1}/{cfg.ppo_epochs}"
            self.optimizer.zero_grad(set_to_none=True)
            stats = self.accumulate_gradients(
                batch,
                advantages,
                proximal,
                normalizer=normalizer,
                step=step,
                where=where,
            )
            if proximal is None:
                proximal = stats.logprobs  # the policy before any update of this step
            if stats.num_tokens == 0:
                # every micro-batch skipped: no gradient, so no optimizer step (AdamW would still
                # decay weights and advance its moments); the same holds for every later epoch
                epochs.append(stats)
                break
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(step, batch.traj_ids, "gradient norm", where)
            if grad_norm == 0.0:
                # no learning signal (every advantage 0, no KL term): AdamW would still move every
                # weight by its momentum; later epochs see the same zero advantages
                self.optimizer.zero_grad(set_to_none=True)
                epochs.append(stats)
                break
            self.optimizer.step()
            self.optimizer_steps += 1
            epochs.append(stats)
            grad_norms.append(grad_norm)
        self.last_step = step
        if not grad_norms:
            logger.warning(
                "step %s: no optimizer step: a zero gradient (every group's rewards equal) or no scored "
                "token in the batch (all masked by trainer.max_token_lag, or prompts that fill sequence_length)",
                step,
            )
        return self._metrics(batch, advantages, epochs, grad_norms)

    def accumulate_gradients(
        self,
        batch: TrajectoryBatch,
        advantages: torch.Tensor,
        proximal_logprobs: torch.Tensor | None = None,
        *,
        normalizer: LossNormalizer | None = None,
        step: int = -1,
        where: str = "",
    ) -> GradientStats:
        """Backward the batch loss into ``.grad`` micro-batch by micro-batch (no optimizer step).

        Each micro-batch's loss is its exact share of the full-batch loss (full
        denominators from ``normalizer``), so the accumulated gradient equals
        that of one pass over the whole batch. ``proximal_logprobs=None`` means
        "the current weights are the proximal policy" (first epoch). A micro-batch
        with no scored token is skipped (its loss would have no graph) and counted.
        """
        cfg = self.config
        batch = batch.to(self.device)
        advantages = advantages.to(self.device)
        scored = self._loss_mask(batch)
        normalizer = normalizer or LossNormalizer.for_mask(scored)
        # Every behaviour logprob exactly 0 means the engine returned none (logprobs off): no TIS then.
        behaviour_missing = bool(scored.any()) and bool(
            (batch.old_logprobs[scored] == 0).all()
        )
        if behaviour_missing and cfg.tis_cap > 0:
            logger.warning(
                "step %s: the batch has no behaviour logprobs (all 0); truncated IS is skipped",
                step,
            )
        all_logprobs = torch.zeros(
            batch.input_ids.shape, dtype=torch.float32, device=self.device
        )
        # every key from the start: under fsdp2 each rank all-reduces exactly this vector
        totals = dict.fromkeys(_SUMMED_TOTALS, 0.0)
        ratio_max = 0.0
        for mb in self._my_passes(self.plan(batch)):
            # fsdp2: another rank has more micro-batches; join its collectives
            if mb is None:
                self.policy.empty_pass(backward=True)
                continue
            part = self._micro_batch_pass(
                batch,
                mb,
                advantages,
                proximal_logprobs,
                scored=scored,
                normalizer=normalizer,
                behaviour_missing=behaviour_missing,
                step=step,
                where=where,
            )
            if part is None:
                totals["skipped"] += 1
                if self.rank is not None:
                    self.policy.empty_pass(backward=True)
                continue
            all_logprobs[part.rows, : part.logprobs.shape[1]] = part.logprobs
            totals["loss"] += part.loss
            totals["pg_loss"] += part.pg_loss
            totals["kl"] += part.kl
            totals["tokens"] += part.num_tokens
            totals["clipped"] += part.clipped
            totals["truncated"] += part.truncated
            totals["entropy"] += part.entropy_sum
            totals["ratio_sum"] += part.ratio_sum
            ratio_max = max(ratio_max, part.ratio_max)
        # fsdp2: per-rank sums -> batch sums (every rank returns the same)
        if self.rank is not None:
            totals = sum_across_ranks(totals, self.rank)
            ratio_max = max_across_ranks({"m": ratio_max}, self.rank)["m"]
        tokens = max(totals["tokens"], 1)
        return GradientStats(
            loss=totals["loss"],
            pg_loss=totals["pg_loss"],
            kl=totals["kl"],
            entropy=totals["entropy"] / tokens,
            clip_fraction=totals["clipped"] / tokens,
            importance_ratio_mean=totals["ratio_sum"] / tokens,
            importance_ratio_max=ratio_max,
            tis_truncated_fraction=totals["truncated"] / tokens,
            num_tokens=int(totals["tokens"]),
            skipped_micro_batches=int(totals["skipped"]),
            logprobs=all_logprobs,
        )

    def _my_passes(self, plan: list[MicroBatch]) -> list[MicroBatch | None]:
        """The micro-batches this process runs: all of them, or this rank's share padded with None (fsdp2)."""
        if self.rank is None:
            return list(plan)
        return rank_share(plan, [mb.tokens for mb in plan], self.rank)

    def plan(self, batch: TrajectoryBatch) -> list[MicroBatch]:
        """The batch's micro-batches: ``micro_batch_size`` rows each, or by ``max_tokens_per_micro_batch``."""
        return plan_micro_batches(
            batch.attention_mask.sum(dim=1).tolist(),
            micro_batch_size=self.config.micro_batch_size,
            max_tokens=self.config.max_tokens_per_micro_batch,
        )

    def _micro_batch_pass(
        self,
        batch: TrajectoryBatch,
        mb: MicroBatch,
        advantages: torch.Tensor,
        proximal_logprobs: torch.Tensor | None,
        *,
        scored: torch.Tensor,
        normalizer: LossNormalizer,
        behaviour_missing: bool,
        step: int,
        where: str,
    ) -> MicroBatchResult | None:
        """Forward and backward one micro-batch's share of the batch loss; None when it has no scored token.

        Everything it reads is indexed by ``mb.rows`` and normalised by full-batch denominators, so the
        passes of any split of a plan add up to the whole batch's loss and gradient.
        """
        cfg = self.config
        rows = torch.as_tensor(mb.rows, dtype=torch.long, device=self.device)
        width = max(int(batch.attention_mask[rows].sum(dim=1).max().item()), 1)
        mask = scored[rows, :width]
        if not bool(mask.any()):
            return None
        out = self.policy.forward(self.model, batch, mb, mask, with_entropy=True)
        logp = out.logprobs
        prox = (
            proximal_logprobs[rows, :width]
            if proximal_logprobs is not None
            else logp.detach()
        )
        behaviour = batch.old_logprobs[rows, :width].float()
        weights, raw_ratio = truncated_importance_weights(
            prox, behaviour, 0.0 if behaviour_missing else cfg.tis_cap
        )
        token_adv = advantages[rows].float().unsqueeze(1).expand_as(logp)
        surrogate, _, clipped = clipped_surrogate(
            logp,
            prox,
            token_adv,
            clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high,
        )
        pg_loss = aggregate(weights * surrogate, mask, cfg.loss_agg, normalizer)
        loss = pg_loss
        kl_value = 0.0
        if self.ref_model is not None and cfg.kl_coef > 0:
            with torch.no_grad(), self.policy.reference_weights():
                ref = self.policy.forward(self.ref_model, batch, mb, mask).logprobs
            kl = aggregate(k3_kl(logp, ref), mask, cfg.loss_agg, normalizer)
            loss = loss + cfg.kl_coef * kl
            kl_value = float(kl.detach())
        finite = bool(torch.isfinite(loss))
        # fsdp2: stop together, since a rank alone in backward would wait forever
        if self.rank is not None:
            finite = all_ranks_agree(finite, self.rank)
        if not finite:
            self.model.zero_grad(set_to_none=True)
            detail = (
                f"{where + ', ' if where else ''}micro-batch {_describe_rows(mb.rows)}"
            )
            raise NonFiniteLossError(
                step, [batch.traj_ids[i] for i in mb.rows], "loss", detail
            )
        loss.backward()
        with torch.no_grad():
            return MicroBatchResult(
                rows=rows,
                logprobs=logp.detach(),
                loss=float(loss.detach()),
                pg_loss=float(pg_loss.detach()),
                kl=kl_value,
                num_tokens=int(mask.sum()),
                clipped=int((clipped & mask).sum()),
                truncated=int(((raw_ratio > cfg.tis_cap) & mask).sum())
                if cfg.tis_cap > 0
                else 0,
                entropy_sum=float(out.entropy[mask].sum())
                if out.entropy is not None
                else 0.0,
                ratio_sum=float(raw_ratio[mask].sum()),
                ratio_max=float(raw_ratio[mask].max()),
            )

    def _loss_mask(self, batch: TrajectoryBatch) -> torch.Tensor:
        """Scored response tokens, less those sampled more than ``max_token_lag`` versions before the policy's."""
        mask = _scored_mask(batch.response_mask)
        lag = token_lag(batch)
        if lag is not None and self.config.max_token_lag >= 0:
            mask &= ~(lag > self.config.max_token_lag)
        return mask

    @torch.no_grad()
    def compute_logprobs(self, batch: TrajectoryBatch) -> torch.Tensor:
        """Current per-token log-probs of ``batch`` ([batch, seq], 0 off the response), micro-batched.

        Scored under ``batch.sampling``, the distribution the behaviour logprobs are of.
        """
        batch = batch.to(self.device)
        scored = _scored_mask(batch.response_mask)
        result = torch.zeros(
            batch.input_ids.shape, dtype=torch.float32, device=self.device
        )
        for mb in self._my_passes(self.plan(batch)):
            if mb is None:
                self.policy.empty_pass(backward=False)
                continue
            rows = torch.as_tensor(mb.rows, dtype=torch.long, device=self.device)
            width = max(int(batch.attention_mask[rows].sum(dim=1).max().item()), 1)
            result[rows, :width] = self.policy.forward(
                self.model, batch, mb, scored[rows, :width]
            ).logprobs
        if self.rank is not None:  # each rank filled its own rows
            result = result.cpu()
            dist.all_reduce(result)
            result = result.to(self.device)
        return result

    def _autocast(self) -> torch.autocast:
        """Forward passes in ``trainer.param_dtype`` (see :meth:`PolicyModel.autocast`)."""
        return self.policy.autocast()

    def reset_reference(self) -> None:
        """Make the KL reference the current weights (after an SFT warm start); see :meth:`PolicyModel.reset_reference`."""
        self.policy.reset_reference()

    def _metrics(
        self,
        batch: TrajectoryBatch,
        advantages: torch.Tensor,
        epochs: list[GradientStats],
        grad_norms: list[float],
    ) -> dict[str, float]:
        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else 0.0

        rewards = batch.rewards.float()
        first = epochs[0]
        # proximal and behaviour log-probs are fixed for the step: ratios are from epoch 1
        lag_metrics = self._token_lag_metrics(batch)
        metrics = {
            "train/loss": mean([e.loss for e in epochs]),
            "train/pg_loss": mean([e.pg_loss for e in epochs]),
            "train/entropy": first.entropy,
            "train/clip_fraction": mean([e.clip_fraction for e in epochs]),
            "train/grad_norm": mean(grad_norms),
            "train/importance_ratio/mean": first.importance_ratio_mean,
            "train/importance_ratio/max": first.importance_ratio_max,
            "train/importance_ratio/truncated_fraction": first.tis_truncated_fraction,
            "train/reward/mean": float(rewards.mean()),
            "train/reward/std": float(rewards.std(unbiased=False)),
            "train/advantage/mean": float(advantages.float().mean()),
            "train/advantage/std": float(advantages.float().std(unbiased=False)),
            "train/response_tokens": float(first.num_tokens),
            "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            TRAIN_SKIPPED_MICRO_BATCHES: float(first.skipped_micro_batches),
            TRAIN_OPTIMIZER_STEPS: float(len(grad_norms)),
        }
        if self.ref_model is not None:
            metrics["train/kl"] = mean([e.kl for e in epochs])
        metrics.update(lag_metrics)
        return metrics

    def _token_lag_metrics(self, batch: TrajectoryBatch) -> dict[str, float]:
        lag = token_lag(batch)
        if lag is None:
            return {}
        response = _scored_mask(batch.response_mask)
        known = response & (lag >= 0)
        masked = response & ~self._loss_mask(batch)
        return {
            TRAIN_TOKEN_LAG_MASKED_FRACTION: float(masked.sum())
            / max(int(response.sum()), 1),
            TRAIN_TOKEN_LAG_MAX: float(lag[known].max()) if bool(known.any()) else 0.0,
        }

    # -- weights and checkpoints ------------------------------------------------------

    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        """A CPU snapshot of the weights under HF names (see :meth:`PolicyModel.state_dict_for_engine`)."""
        return self.policy.state_dict_for_engine()

    def engine_weight_chunks(self) -> Iterator[dict[str, torch.Tensor]]:
        """The weights for the engines in parts (see :meth:`PolicyModel.engine_weight_chunks`)."""
        return self.policy.engine_weight_chunks()

    def memory(self) -> dict[str, int]:
        """Parameter and AdamW-state bytes this process holds (its shards under fsdp2)."""
        return self.policy.memory()

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        """Model, optimizer, reference, RNG and step counters (:func:`save_trainer_checkpoint`)."""
        counters = {
            "optimizer_steps": self.optimizer_steps,
            "last_step": self.last_step,
        }
        save_trainer_checkpoint(self.policy, directory, counters, extra_state)

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore weights, optimizer and KL reference (a run dir means its newest checkpoint); config hyperparameters win.

        A DCP checkpoint (written by fsdp2 at any number of ranks) loads under
        either strategy; a single checkpoint (HF weights + ``optimizer.pt``) only
        under single.
        """
        trainer_state, extra_state = load_trainer_checkpoint(self.policy, directory)
        self.optimizer_steps = int(trainer_state.get("optimizer_steps", 0))
        self.last_step = trainer_state.get("last_step")
        return extra_state


#: The per-pass sums accumulate_gradients adds up across fsdp2 ranks.
_SUMMED_TOTALS = (
    "loss",
    "pg_loss",
    "kl",
    "tokens",
    "clipped",
    "truncated",
    "entropy",
    "ratio_sum",
    "skipped",
)


def _describe_rows(rows: Sequence[int]) -> str:
    """``rows 4-7`` for a consecutive run, else ``rows 0, 3, 9`` (the first 8)."""
    if not rows:
        return "rows (none)"
    if list(rows) == list(range(rows[0], rows[-1] + 1)):
        return f"rows {rows[0]}-{rows[-1]}" if len(rows) > 1 else f"row {rows[0]}"
    shown = ", ".join(str(r) for r in rows[:8])
    return f"rows {shown}" + (f" (+{len(rows) - 8} more)" if len(rows) > 8 else "")
