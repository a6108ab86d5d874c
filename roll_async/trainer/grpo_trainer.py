"""The built-in trainer: GRPO/RLOO advantages, clipped PPO loss with truncated importance sampling, AdamW.

A run needs a trainer that works out of the box on the same HF causal LM the
engine serves, on one device (CUDA when present, else CPU); custom trainers
plug in through :class:`~roll_async.trainer.base.Trainer` instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from roll_async.config.sections import TrainerConfig
from roll_async.config.validation import pure_low_precision_message
from roll_async.errors import ConfigError, NonFiniteLossError
from roll_async.metrics import (
    TRAIN_OPTIMIZER_STEPS,
    TRAIN_SKIPPED_MICRO_BATCHES,
    TRAIN_TOKEN_LAG_MASKED_FRACTION,
    TRAIN_TOKEN_LAG_MAX,
)
from roll_async.prompts.images import VisionProcessor, model_is_vision_language
from roll_async.trainer import lora as lora_adapters
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.checkpoint import (
    KL_REFERENCE_DIR,
    checkpoint_state_dict,
    load_model_weights,
    load_optimizer_state,
    read_checkpoint_state,
    resolve_resume_dir,
    restore_rng_state,
    save_rng_state,
    swap_into_place,
    tied_parameter_names,
    write_checkpoint,
    write_checkpoint_state,
    write_hf_weights,
)
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.losses import (
    LossNormalizer,
    TokenLogprobs,
    aggregate,
    clipped_surrogate,
    k3_kl,
    token_logprobs,
    truncated_importance_weights,
)
from roll_async.trainer.micro_batches import (
    MicroBatch,
    model_supports_packing,
    packed_token_logprobs,
    plan_micro_batches,
)
from roll_async.trainer.model_loading import (
    empty_causal_lm,
    load_causal_lm,
    load_into_shards,
)
from roll_async.trainer.parallel.data_parallel import (
    all_ranks_agree,
    max_across_ranks,
    rank_share,
    sum_across_ranks,
)
from roll_async.trainer.parallel.process_group import RankInfo
from roll_async.trainer.parallel.sharded_checkpoint import (
    check_resumable_by_fsdp2,
    has_reference,
    is_sharded_checkpoint,
    load_sharded,
    save_sharded,
)
from roll_async.trainer.parallel.sharding import rank_memory, shard_model
from roll_async.trainer.parallel.weight_gather import gathered_weight_chunks

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str, ray_gpu_ids: list[Any] | None = None) -> torch.device:
    """``auto`` means CUDA when available, else CPU; anything else is passed to ``torch.device``.

    ``ray_gpu_ids``: in a Ray actor, the GPUs Ray assigned it (``ray.get_gpu_ids()``); ``auto`` then means
    CUDA only if that list is not empty, so an actor given no GPU never takes one it can see.
    """
    if device == "auto":
        assigned = ray_gpu_ids is None or len(ray_gpu_ids) > 0
        return torch.device("cuda" if assigned and torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in _DTYPES:
        raise ConfigError(
            f"trainer.dtype={dtype!r} is unknown; use one of float32, bfloat16, float16"
        )
    return _DTYPES[dtype]


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

    Precision: weights and AdamW state are float32 (``trainer.dtype`` must be
    float32); ``trainer.param_dtype: bfloat16`` runs the forward passes under
    ``torch.autocast`` in bfloat16, so small updates still land on the float32
    master weights.

    ``rank`` (trainer.strategy fsdp2, built by roll_async.trainer.ranks): this
    process is one SPMD rank; the model and reference are sharded with FSDP2
    (its mixed-precision policy replaces autocast), each rank runs its share of
    the micro-batch plan, and weights and checkpoints are gathered or written
    collectively (roll_async.trainer.parallel).
    """

    def __init__(
        self,
        config: TrainerConfig,
        model_path: str | os.PathLike[str],
        *,
        trust_remote_code: bool = False,
        tokenizer: Any = None,
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
        self.model_path = str(model_path)
        #: This process's place among the fsdp2 ranks; None for the single strategy.
        self.rank = rank
        self.device = rank.device if rank is not None else resolve_device(config.device)
        if resolve_dtype(config.dtype) != torch.float32:
            raise ConfigError(pure_low_precision_message(config.dtype))
        #: Master weights and AdamW state: always float32 (see trainer.param_dtype for the compute dtype).
        self.dtype = torch.float32
        #: Forward/backward compute dtype (torch.autocast when not float32).
        self.compute_dtype = resolve_dtype(config.param_dtype)
        # fsdp2 ranks build it empty, shard it, then receive their shards from the main rank (_shard_and_load).
        self.model = (
            empty_causal_lm(self.model_path, self.dtype, trust_remote_code)
            if rank is not None
            else load_causal_lm(
                self.model_path, self.dtype, self.device, trust_remote_code
            )
        )
        #: The model's processor when it is vision-language: it turns a batch's images into pixel inputs.
        self.vision = (
            VisionProcessor.load(self.model_path, trust_remote_code)
            if model_is_vision_language(self.model_path)
            else None
        )
        #: Tied aliases (lm_head sharing the embedding): left out of the full weights fsdp2 gathers for
        #: engines and checkpoints. Named on the plain HF model (a LoRA run syncs its adapter instead).
        self.tied_names = tied_parameter_names(self.model)
        #: trainer.lora.rank > 0: the model is a peft model whose adapters alone train (roll_async.trainer.lora).
        self.lora = lora_adapters.lora_enabled(config.lora)
        if self.lora:
            self.model = self._apply_lora(self.model)
        if config.gradient_checkpointing:
            # Non-reentrant: gradients reach the weights whether or not the inputs require grad.
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            if self.lora:  # frozen embeddings: checkpointed blocks need an input that requires grad
                self.model.enable_input_require_grads()
        if rank is not None:
            self._shard_and_load(
                self.model,
                trust_remote_code,
                prepare=self._apply_lora if self.lora else None,
            )
        self.model.train()
        #: Micro-batches run packed (rows end to end, no padding): a token budget is set and the model can.
        self.packing = config.max_tokens_per_micro_batch > 0 and model_supports_packing(
            self.model
        )
        if config.max_tokens_per_micro_batch > 0 and not self.packing:
            logger.warning(
                "trainer.max_tokens_per_micro_batch=%s: %s cannot run packed sequences (a vision-language "
                "model, or an attention implementation without packed-sequence masking); micro-batches "
                "are grouped by the token budget but padded to their longest row",
                config.max_tokens_per_micro_batch,
                type(self.model).__name__,
            )
        # The reference exists only when the KL term needs it (a full second copy of the weights).
        self.ref_model = None
        if config.kl_coef > 0 and self.lora:
            # the base model with the adapters off (_reference_weights): no second copy
            self.ref_model = self.model
        elif config.kl_coef > 0 and rank is not None:
            self.ref_model = empty_causal_lm(
                self.model_path, self.dtype, trust_remote_code
            )
            self.ref_model.eval().requires_grad_(False)
            self._shard_and_load(self.ref_model, trust_remote_code, trainable=False)
        elif config.kl_coef > 0:
            self.ref_model = load_causal_lm(
                self.model_path, self.dtype, self.device, trust_remote_code
            )
            self.ref_model.eval().requires_grad_(False)
        #: "initial": the reference is model.path's weights; "snapshot": a copy taken later (reset_reference,
        #: after an SFT warm start), which checkpoints save and resume restores.
        self.reference_source = "initial"
        self.tokenizer = (
            tokenizer
            if tokenizer is not None
            else _try_load_tokenizer(self.model_path, trust_remote_code)
        )
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=(float(config.adam_betas[0]), float(config.adam_betas[1])),
            weight_decay=config.weight_decay,
        )
        self.optimizer_steps = 0
        self.last_step: int | None = None

    def _shard_and_load(
        self,
        model: torch.nn.Module,
        trust_remote_code: bool,
        *,
        trainable: bool = True,
        prepare: Callable[[torch.nn.Module], Any] | None = None,
    ) -> None:
        """fsdp2: shard an :func:`empty_causal_lm` model, then fill its shards from the main rank's read."""
        assert self.rank is not None
        shard_model(
            model,
            self.rank,
            self.compute_dtype,
            resolve_dtype(self.config.reduce_dtype),
            trainable=trainable,
        )
        load_into_shards(
            model, self.model_path, self.rank, trust_remote_code, prepare=prepare
        )

    def _apply_lora(self, model: torch.nn.Module) -> Any:
        """peft adapters on ``model``; the frozen base is then held in the compute dtype (bf16: half the bytes)."""
        return lora_adapters.frozen_base_in(
            lora_adapters.apply_lora(model, self.config.lora), self.compute_dtype
        )

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
            self.optimizer.step()
            self.optimizer_steps += 1
            epochs.append(stats)
            grad_norms.append(grad_norm)
        self.last_step = step
        if not grad_norms:
            logger.warning(
                "step %s: no scored token in the batch (all masked by trainer.max_token_lag, or prompts "
                "that fill sequence_length): no optimizer step",
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
                self._empty_pass(backward=True)
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
                    self._empty_pass(backward=True)
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

    def _empty_pass(self, *, backward: bool) -> None:
        """fsdp2: a forward (and backward) with zero gradient, so this rank joins a pass it has no rows for.

        FSDP2 gathers parameters in every forward and reduces gradients in every
        backward, so all ranks must run the same passes in the same order: policy
        forward, reference forward, agreement on a finite loss, backward.
        """
        assert self.rank is not None
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        with self._autocast():
            logits = self.model(input_ids=ids, use_cache=False).logits
            if backward and self.ref_model is not None and self.config.kl_coef > 0:
                with torch.no_grad():
                    self.ref_model(input_ids=ids, use_cache=False)
        if backward:
            all_ranks_agree(True, self.rank)
            (logits.float().sum() * 0.0).backward()

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
        out = self._forward(self.model, batch, mb, mask, with_entropy=True)
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
            with torch.no_grad(), self._reference_weights():
                ref = self._forward(self.ref_model, batch, mb, mask).logprobs
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

    def _forward(
        self,
        model: Any,
        batch: TrajectoryBatch,
        mb: MicroBatch,
        score_mask: torch.Tensor,
        *,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """Log-probs of ``mb``'s rows ([rows, width], the padded layout), packed when ``self.packing``.

        ``score_mask`` is in that layout too ([rows, width]).
        """
        rows = torch.as_tensor(mb.rows, dtype=torch.long, device=self.device)
        width = score_mask.shape[1]
        with self._autocast():
            if self.packing:
                full_mask = torch.zeros_like(batch.response_mask, dtype=torch.bool)
                full_mask[rows, :width] = score_mask
                return packed_token_logprobs(
                    model,
                    batch.input_ids,
                    batch.attention_mask,
                    batch.position_ids,
                    mb.rows,
                    score_mask=full_mask,
                    with_entropy=with_entropy,
                    sampling=batch.sampling,
                )
            return token_logprobs(
                model,
                batch.input_ids[rows, :width],
                batch.attention_mask[rows, :width],
                batch.position_ids[rows, :width],
                score_mask=score_mask,
                with_entropy=with_entropy,
                sampling=batch.sampling,
                model_inputs=self._vision_inputs(batch, mb.rows),
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
                self._empty_pass(backward=False)
                continue
            rows = torch.as_tensor(mb.rows, dtype=torch.long, device=self.device)
            width = max(int(batch.attention_mask[rows].sum(dim=1).max().item()), 1)
            result[rows, :width] = self._forward(
                self.model, batch, mb, scored[rows, :width]
            ).logprobs
        if self.rank is not None:  # each rank filled its own rows
            result = result.cpu()
            dist.all_reduce(result)
            result = result.to(self.device)
        return result

    def _autocast(self) -> torch.autocast:
        """Forward passes in ``trainer.param_dtype`` (weights stay float32); a no-op for float32.

        Under fsdp2 the mixed-precision policy casts the gathered parameters instead.
        """
        return torch.autocast(
            device_type=self.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32 and self.rank is None,
        )

    def _reference_weights(self) -> Any:
        """The context the KL reference's forward runs in: the adapters off with LoRA, else nothing."""
        return lora_adapters.adapters_off(self.model) if self.lora else nullcontext()

    def _vision_inputs(
        self, batch: TrajectoryBatch, rows: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """Pixel inputs of the rows' images for a vision-language model ({} for text models or no images)."""
        if self.vision is None or not batch.images:
            return {}
        inputs = self.vision.pixel_inputs([batch.images[i] for i in rows])
        return {
            name: t.to(self.device, self.dtype if t.is_floating_point() else t.dtype)
            for name, t in inputs.items()
        }

    def reset_reference(self) -> None:
        """Make the KL reference the current weights (after an SFT warm start); no-op without a reference.

        With LoRA the reference stays the base model (adapters off): a snapshot would be a second copy.
        """
        if self.lora:
            if self.ref_model is not None:
                logger.warning(
                    "trainer.lora: the KL reference stays the base model with the adapters off, not the "
                    "weights after the SFT warm start"
                )
            return
        if self.ref_model is not None:
            self.ref_model.load_state_dict(self.model.state_dict())
            self.reference_source = "snapshot"

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
        """A CPU snapshot of the weights under HF checkpoint names (tied ``lm_head.weight`` left out).

        Under fsdp2 this gathers the whole model on the main rank ({} elsewhere);
        weight syncs use :meth:`engine_weight_chunks`, which never does.
        With LoRA: ``trainer.lora.sync=adapter`` gives the adapter alone under peft's saved names (the engines
        serve it as a LoRA request), ``merged`` the base + adapter merged under the base model's HF names.
        """
        merged: dict[str, torch.Tensor] = {}
        for chunk in self.engine_weight_chunks():
            merged.update(chunk)
        return merged

    def engine_weight_chunks(self) -> Iterator[dict[str, torch.Tensor]]:
        """The weights for the engines in parts: one part under single, one per shard unit under fsdp2.

        Under fsdp2 every rank must iterate in step (each part is gathered
        collectively); only the main rank's parts hold tensors.
        """
        if self.rank is None:
            if self.lora and self.config.lora.sync == "adapter":
                weights = lora_adapters.adapter_state_dict(self.model)
            elif self.lora:
                weights = lora_adapters.merged_state_dict(self.model)
            else:
                weights = checkpoint_state_dict(self.model)
            yield {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}
        elif self.lora:  # fsdp2 syncs the adapter (validation refuses sync=merged)
            yield lora_adapters.gathered_adapter_state_dict(
                self.model, self.rank.is_main
            )
        else:
            yield from gathered_weight_chunks(self.model, self.rank, self.tied_names)

    def memory(self) -> dict[str, int]:
        """Parameter and AdamW-state bytes this process holds (its shards under fsdp2)."""
        return rank_memory(self.model, self.optimizer)

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        if self.rank is not None:
            self._save_sharded_checkpoint(Path(directory).resolve(), extra_state)
            return
        write_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            tokenizer=self.tokenizer,
            trainer_state=self._trainer_state(),
            extra_state=extra_state,
            reference_model=self.ref_model
            if self.reference_source == "snapshot"
            else None,
        )

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "optimizer_steps": self.optimizer_steps,
            "last_step": self.last_step,
            "model_path": self.model_path,
            "trainer_config": dataclasses.asdict(self.config),
            "kl_reference": self.reference_source
            if self.ref_model is not None
            else None,
            "world_size": self.rank.world_size if self.rank is not None else 1,
        }

    def _save_sharded_checkpoint(
        self, target: Path, extra_state: dict[str, Any]
    ) -> None:
        """fsdp2: every rank writes its DCP shards; the main rank writes HF weights (layer by layer) and the rest.

        The directory is written beside the target and renamed into place by the
        main rank once every rank has finished, as for a single checkpoint; with
        several nodes the run directory must be on a shared filesystem.
        """
        assert self.rank is not None
        tmp = target.parent / f".{target.name}.tmp-sharded"
        if self.rank.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        reference = self.ref_model if self.reference_source == "snapshot" else None
        save_sharded(tmp, self.model, self.optimizer, reference)
        save_rng_state(tmp, self.rank.rank)
        if self.lora:  # the adapter as peft saves it, like a single LoRA checkpoint
            adapter = lora_adapters.gathered_adapter_state_dict(
                self.model, self.rank.is_main
            )
            if self.rank.is_main:
                lora_adapters.write_adapter(
                    tmp, adapter, self.config.lora, self.model_path
                )
        else:
            chunks = gathered_weight_chunks(self.model, self.rank, self.tied_names)
            if self.rank.is_main:
                write_hf_weights(
                    chunks,
                    tmp,
                    self.model.config,
                    getattr(self.model, "generation_config", None),
                )
            else:
                for _ in chunks:
                    pass
        if self.rank.is_main:
            write_checkpoint_state(
                tmp, self.tokenizer, self._trainer_state(), extra_state
            )
            swap_into_place(tmp, target)
        dist.barrier()

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore weights, optimizer and KL reference (a run dir means its newest checkpoint); config hyperparameters win.

        A DCP checkpoint (written by fsdp2 at any number of ranks) loads under
        either strategy; a single checkpoint (HF weights + ``optimizer.pt``) only
        under single.
        """
        path = resolve_resume_dir(directory)
        trainer_state, extra_state = read_checkpoint_state(path)
        if self.rank is not None:
            check_resumable_by_fsdp2(path, str(directory))
        if is_sharded_checkpoint(path):
            snapshot = trainer_state.get("kl_reference") == "snapshot"
            reference = self.ref_model if snapshot and has_reference(path) else None
            load_sharded(path, self.model, self.optimizer, reference)
            self._apply_config_hyperparameters()
        else:
            # a LoRA checkpoint holds the adapter (the base is model_path)
            if self.lora:
                lora_adapters.load_adapter_weights(self.model, path)
            else:
                load_model_weights(self.model, path)
            if load_optimizer_state(self.optimizer, path):
                self._apply_config_hyperparameters()
        restore_rng_state(path, self.rank.rank if self.rank is not None else 0)
        self.optimizer_steps = int(trainer_state.get("optimizer_steps", 0))
        self.last_step = trainer_state.get("last_step")
        self._restore_reference(path, trainer_state)
        return extra_state

    def _apply_config_hyperparameters(self) -> None:
        """Resuming with a changed lr etc. uses the new values."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr
            group["betas"] = (
                float(self.config.adam_betas[0]),
                float(self.config.adam_betas[1]),
            )
            group["weight_decay"] = self.config.weight_decay

    def _restore_reference(self, path: Any, trainer_state: dict[str, Any]) -> None:
        """The KL reference the checkpointed run used: its saved snapshot, else model.path's weights."""
        if self.ref_model is None or self.lora:
            return
        if trainer_state.get("kl_reference") == "snapshot":
            if not is_sharded_checkpoint(path):
                load_model_weights(self.ref_model, path / KL_REFERENCE_DIR)
            self.reference_source = "snapshot"
        elif (
            trainer_state.get("kl_reference") is None
            and self.config.kl_coef > 0
            and (trainer_state.get("trainer_config") or {}).get("kl_coef", 0) > 0
        ):
            logger.warning(
                "checkpoint %s does not say which KL reference it used (an older checkpoint): the reference is "
                "model.path's weights, not a post-SFT snapshot",
                path,
            )


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


def token_lag(batch: TrajectoryBatch) -> torch.Tensor | None:
    """``policy_version - token_version`` per token ([batch, seq]; -1 where the version is unknown).

    None when the batch lacks per-token versions or the policy version (hand-built batches).
    """
    if batch.token_versions is None or batch.policy_version is None:
        return None
    versions = batch.token_versions.to(batch.response_mask.device)
    return torch.where(
        versions >= 0,
        (batch.policy_version - versions).clamp(min=0),
        torch.full_like(versions, -1),
    )


def _describe_rows(rows: Sequence[int]) -> str:
    """``rows 4-7`` for a consecutive run, else ``rows 0, 3, 9`` (the first 8)."""
    if not rows:
        return "rows (none)"
    if list(rows) == list(range(rows[0], rows[-1] + 1)):
        return f"rows {rows[0]}-{rows[-1]}" if len(rows) > 1 else f"row {rows[0]}"
    shown = ", ".join(str(r) for r in rows[:8])
    return f"rows {shown}" + (f" (+{len(rows) - 8} more)" if len(rows) > 8 else "")


def _scored_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """Response tokens that can be scored: position 0 has no prefix to predict it from."""
    mask = response_mask.bool().clone()
    mask[:, 0] = False
    return mask


def _try_load_tokenizer(model_path: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer, saved with checkpoints when there is one; None if the directory has none."""
    try:
        from transformers import AutoTokenizer  # heavy: loaded only when needed

        return AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError):
        return None
