"""The built-in trainer: GRPO/RLOO advantages, clipped PPO loss with truncated importance sampling, AdamW.

A run needs a trainer that works out of the box on the same HF causal LM the
engine serves, on one device (CUDA when present, else CPU); custom trainers
plug in through :class:`~roll_async.trainer.base.Trainer` instead.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from roll_async.config.schema import TrainerConfig
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
    write_checkpoint,
)
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.losses import (
    LossNormalizer,
    aggregate,
    clipped_surrogate,
    k3_kl,
    token_logprobs,
    truncated_importance_weights,
)

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


def load_causal_lm(
    model_path: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool = False,
) -> Any:
    """An HF causal LM on ``device`` with dropout off."""
    # transformers is heavy: loaded only when a model is.
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    dtype_key = (
        "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    )
    auto_class = (
        AutoModelForImageTextToText
        if model_is_vision_language(model_path)
        else AutoModelForCausalLM
    )
    model = auto_class.from_pretrained(
        model_path, trust_remote_code=trust_remote_code, **{dtype_key: dtype}
    ).to(device)
    disable_dropout(model)
    return model


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout (modules and the attention-dropout attributes HF attention layers read)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    if config is not None and isinstance(
        getattr(config, "attention_dropout", None), float
    ):
        config.attention_dropout = 0.0


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


class GRPOTrainer:
    """The built-in :class:`~roll_async.trainer.base.Trainer`.

    It trains the same HF causal LM the engine serves, on one device (CUDA when
    present, else CPU). One ``train_step`` = ``ppo_epochs`` optimizer steps over the
    whole rollout batch, each accumulating gradients over micro-batches of
    ``micro_batch_size`` trajectories; the loss formula and the meaning of the
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
    """

    def __init__(
        self,
        config: TrainerConfig,
        model_path: str | os.PathLike[str],
        *,
        trust_remote_code: bool = False,
        tokenizer: Any = None,
    ) -> None:
        if config.ppo_epochs < 1:
            raise ConfigError(f"trainer.ppo_epochs={config.ppo_epochs}: must be >= 1")
        if config.micro_batch_size < 1:
            raise ConfigError(
                f"trainer.micro_batch_size={config.micro_batch_size}: must be >= 1"
            )
        self.config = config
        self.model_path = str(model_path)
        self.device = resolve_device(config.device)
        if resolve_dtype(config.dtype) != torch.float32:
            raise ConfigError(pure_low_precision_message(config.dtype))
        #: Master weights and AdamW state: always float32 (see trainer.param_dtype for the compute dtype).
        self.dtype = torch.float32
        #: Forward/backward compute dtype (torch.autocast when not float32).
        self.compute_dtype = resolve_dtype(config.param_dtype)
        self.model = load_causal_lm(
            self.model_path, self.dtype, self.device, trust_remote_code
        )
        #: The model's processor when it is vision-language: it turns a batch's images into pixel inputs.
        self.vision = (
            VisionProcessor.load(self.model_path, trust_remote_code)
            if model_is_vision_language(self.model_path)
            else None
        )
        #: trainer.lora.rank > 0: the model is a peft model whose adapters alone train (roll_async.trainer.lora).
        self.lora = lora_adapters.lora_enabled(config.lora)
        if self.lora:
            self.model = lora_adapters.apply_lora(self.model, config.lora)
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.lora:  # frozen embeddings: checkpointed blocks need an input that requires grad
                self.model.enable_input_require_grads()
        self.model.train()
        # The reference exists only when the KL term needs it (a full second copy of the weights).
        self.ref_model = None
        if config.kl_coef > 0 and self.lora:
            # the base model with the adapters off (_reference_weights): no second copy
            self.ref_model = self.model
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
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
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
        size = len(batch)
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
        totals: dict[str, float] = collections.defaultdict(float)
        for start in range(0, size, cfg.micro_batch_size):
            rows = slice(start, min(start + cfg.micro_batch_size, size))
            width = max(int(batch.attention_mask[rows].sum(dim=1).max().item()), 1)
            cols = slice(0, width)
            mask = scored[rows, cols]
            if not bool(mask.any()):
                totals["skipped"] += 1
                continue
            with self._autocast():
                out = token_logprobs(
                    self.model,
                    batch.input_ids[rows, cols],
                    batch.attention_mask[rows, cols],
                    batch.position_ids[rows, cols],
                    score_mask=mask,
                    with_entropy=True,
                    sampling=batch.sampling,
                    model_inputs=self._vision_inputs(batch, rows),
                )
            logp = out.logprobs
            prox = (
                proximal_logprobs[rows, cols]
                if proximal_logprobs is not None
                else logp.detach()
            )
            behaviour = batch.old_logprobs[rows, cols].float()
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
                with torch.no_grad(), self._autocast(), self._reference_weights():
                    ref = token_logprobs(
                        self.ref_model,
                        batch.input_ids[rows, cols],
                        batch.attention_mask[rows, cols],
                        batch.position_ids[rows, cols],
                        score_mask=mask,
                        sampling=batch.sampling,
                        model_inputs=self._vision_inputs(batch, rows),
                    ).logprobs
                kl = aggregate(k3_kl(logp, ref), mask, cfg.loss_agg, normalizer)
                loss = loss + cfg.kl_coef * kl
                kl_value = float(kl.detach())
            if not torch.isfinite(loss):
                self.model.zero_grad(set_to_none=True)
                detail = f"{where + ', ' if where else ''}micro-batch rows {rows.start}-{rows.stop - 1}"
                raise NonFiniteLossError(step, batch.traj_ids[rows], "loss", detail)
            loss.backward()
            all_logprobs[rows, cols] = logp.detach()
            with torch.no_grad():
                n_tokens = int(mask.sum())
                totals["loss"] += float(loss.detach())
                totals["pg_loss"] += float(pg_loss.detach())
                totals["kl"] += kl_value
                totals["tokens"] += n_tokens
                totals["clipped"] += int((clipped & mask).sum())
                totals["truncated"] += (
                    int(((raw_ratio > cfg.tis_cap) & mask).sum())
                    if cfg.tis_cap > 0
                    else 0
                )
                totals["entropy"] += (
                    float(out.entropy[mask].sum()) if out.entropy is not None else 0.0
                )
                totals["ratio_sum"] += float(raw_ratio[mask].sum())
                if n_tokens:
                    totals["ratio_max"] = max(
                        totals.get("ratio_max", 0.0), float(raw_ratio[mask].max())
                    )
        tokens = max(totals["tokens"], 1)
        return GradientStats(
            loss=totals["loss"],
            pg_loss=totals["pg_loss"],
            kl=totals["kl"],
            entropy=totals["entropy"] / tokens,
            clip_fraction=totals["clipped"] / tokens,
            importance_ratio_mean=totals["ratio_sum"] / tokens,
            importance_ratio_max=totals.get("ratio_max", 0.0),
            tis_truncated_fraction=totals["truncated"] / tokens,
            num_tokens=int(totals["tokens"]),
            skipped_micro_batches=int(totals["skipped"]),
            logprobs=all_logprobs,
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
        for start in range(0, len(batch), self.config.micro_batch_size):
            rows = slice(start, min(start + self.config.micro_batch_size, len(batch)))
            width = max(int(batch.attention_mask[rows].sum(dim=1).max().item()), 1)
            cols = slice(0, width)
            with self._autocast():
                result[rows, cols] = token_logprobs(
                    self.model,
                    batch.input_ids[rows, cols],
                    batch.attention_mask[rows, cols],
                    batch.position_ids[rows, cols],
                    score_mask=scored[rows, cols],
                    sampling=batch.sampling,
                    model_inputs=self._vision_inputs(batch, rows),
                ).logprobs
        return result

    def _autocast(self) -> torch.autocast:
        """Forward passes in ``trainer.param_dtype`` (weights stay float32); a no-op for float32."""
        return torch.autocast(
            device_type=self.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32,
        )

    def _reference_weights(self) -> Any:
        """The context the KL reference's forward runs in: the adapters off with LoRA, else nothing."""
        return lora_adapters.adapters_off(self.model) if self.lora else nullcontext()

    def _vision_inputs(
        self, batch: TrajectoryBatch, rows: slice
    ) -> dict[str, torch.Tensor]:
        """Pixel inputs of the rows' images for a vision-language model ({} for text models or no images)."""
        if self.vision is None or not batch.images:
            return {}
        inputs = self.vision.pixel_inputs(batch.images[rows])
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

        With LoRA: ``trainer.lora.sync=adapter`` gives the adapter alone under peft's saved names (the engines
        serve it as a LoRA request), ``merged`` the base + adapter merged under the base model's HF names.
        """
        if self.lora and self.config.lora.sync == "adapter":
            weights = lora_adapters.adapter_state_dict(self.model)
        elif self.lora:
            weights = lora_adapters.merged_state_dict(self.model)
        else:
            weights = checkpoint_state_dict(self.model)
        return {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        write_checkpoint(
            directory,
            model=self.model,
            optimizer=self.optimizer,
            tokenizer=self.tokenizer,
            trainer_state={
                "optimizer_steps": self.optimizer_steps,
                "last_step": self.last_step,
                "model_path": self.model_path,
                "trainer_config": dataclasses.asdict(self.config),
                "kl_reference": self.reference_source
                if self.ref_model is not None
                else None,
            },
            extra_state=extra_state,
            reference_model=self.ref_model
            if self.reference_source == "snapshot"
            else None,
        )

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore weights, optimizer and KL reference (a run dir means its newest checkpoint); config hyperparameters win."""
        path = resolve_resume_dir(directory)
        trainer_state, extra_state = read_checkpoint_state(path)
        if self.lora:  # a LoRA checkpoint holds the adapter (the base is model_path)
            lora_adapters.load_adapter_weights(self.model, path)
        else:
            load_model_weights(self.model, path)
        if load_optimizer_state(self.optimizer, path):
            # resuming with a changed lr etc. uses the new values
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr
                group["betas"] = (
                    float(self.config.adam_betas[0]),
                    float(self.config.adam_betas[1]),
                )
                group["weight_decay"] = self.config.weight_decay
        self.optimizer_steps = int(trainer_state.get("optimizer_steps", 0))
        self.last_step = trainer_state.get("last_step")
        self._restore_reference(path, trainer_state)
        return extra_state

    def _restore_reference(self, path: Any, trainer_state: dict[str, Any]) -> None:
        """The KL reference the checkpointed run used: its saved snapshot, else model.path's weights."""
        if self.ref_model is None or self.lora:
            return
        if trainer_state.get("kl_reference") == "snapshot":
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
