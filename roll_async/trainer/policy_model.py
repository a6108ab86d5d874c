"""The trained model and what comes with it: loading (single or fsdp2), LoRA, the KL reference, AdamW, engine weights.

An algorithm's loss step reads and updates a :class:`PolicyModel` without knowing
how its weights were loaded, sharded or wrapped, so a second algorithm can reuse
it (:class:`~roll_async.trainer.grpo_trainer.GRPOTrainer` is the built-in one);
checkpoints of it are written and read by :mod:`roll_async.trainer.checkpoint`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from roll_async.config.sections import TrainerConfig
from roll_async.config.validation import pure_low_precision_message
from roll_async.errors import ConfigError
from roll_async.prompts.images import VisionProcessor, model_is_vision_language
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trainer import lora as lora_adapters
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.hf_names import checkpoint_state_dict, tied_parameter_names
from roll_async.trainer.losses import TokenLogprobs, token_logprobs
from roll_async.trainer.micro_batches import (
    MicroBatch,
    model_supports_packing,
    packed_token_logprobs,
)
from roll_async.trainer.model_loading import (
    empty_causal_lm,
    load_causal_lm,
    load_into_shards,
)
from roll_async.trainer.parallel.data_parallel import all_ranks_agree
from roll_async.trainer.parallel.process_group import RankInfo
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


def warmup_lr(lr: float, warmup_steps: int, step: int) -> float:
    """The learning rate of training step ``step`` (0-based): linear warm-up over ``warmup_steps``, then ``lr``.

    Taken from the step number, not from a scheduler's state, so a resumed run lands on the same value.
    """
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (max(0, step) + 1) / warmup_steps)


class PolicyModel:
    """The HF causal LM being trained, its KL reference, tokenizer and AdamW, on one device or one fsdp2 rank.

    Precision: weights and AdamW state are float32 (``trainer.dtype`` must be
    float32); ``trainer.param_dtype: bfloat16`` runs the forward passes under
    ``torch.autocast`` in bfloat16 (:meth:`autocast`), so small updates still
    land on the float32 master weights.

    ``rank`` (trainer.strategy fsdp2): this process is one SPMD rank; the model
    and reference are sharded with FSDP2 (its mixed-precision policy replaces
    autocast), and weights are gathered collectively (roll_async.trainer.parallel).
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
            # the base model with the adapters off (reference_weights): no second copy
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
            else try_load_tokenizer(self.model_path, trust_remote_code)
        )
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=(float(config.adam_betas[0]), float(config.adam_betas[1])),
            weight_decay=config.weight_decay,
        )

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

    # -- forward passes ----------------------------------------------------------------

    def forward(
        self,
        model: torch.nn.Module,
        batch: TrajectoryBatch,
        mb: MicroBatch,
        score_mask: torch.Tensor,
        *,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """Log-probs of ``mb``'s rows ([rows, width], the padded layout), packed when ``self.packing``.

        ``model``: :attr:`model` or :attr:`ref_model`; ``score_mask`` is in the
        [rows, width] layout too.
        """
        rows = torch.as_tensor(mb.rows, dtype=torch.long, device=self.device)
        width = score_mask.shape[1]
        with self.autocast():
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

    def empty_pass(self, *, backward: bool) -> None:
        """fsdp2: a forward (and backward) with zero gradient, so this rank joins a pass it has no rows for.

        FSDP2 gathers parameters in every forward and reduces gradients in every
        backward, so all ranks must run the same passes in the same order: policy
        forward, reference forward, agreement on a finite loss, backward.
        """
        assert self.rank is not None
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        with self.autocast():
            logits = self.model(input_ids=ids, use_cache=False).logits
            if backward and self.ref_model is not None and self.config.kl_coef > 0:
                with torch.no_grad():
                    self.ref_model(input_ids=ids, use_cache=False)
        if backward:
            all_ranks_agree(True, self.rank)
            (logits.float().sum() * 0.0).backward()

    def autocast(self) -> torch.autocast:
        """Forward passes in ``trainer.param_dtype`` (weights stay float32); a no-op for float32.

        Under fsdp2 the mixed-precision policy casts the gathered parameters instead.
        """
        return torch.autocast(
            device_type=self.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32 and self.rank is None,
        )

    def reference_weights(self) -> AbstractContextManager[None]:
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

    # -- reference and optimizer -------------------------------------------------------

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

    def apply_config_hyperparameters(self) -> None:
        """Resuming with a changed lr etc. uses the new values."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr
            group["betas"] = (
                float(self.config.adam_betas[0]),
                float(self.config.adam_betas[1]),
            )
            group["weight_decay"] = self.config.weight_decay

    # -- weights for the engines -------------------------------------------------------

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


def try_load_tokenizer(
    model_path: str, trust_remote_code: bool
) -> ChatTokenizer | None:
    """The model's tokenizer, saved with checkpoints when there is one; None if the directory has none."""
    try:
        from transformers import AutoTokenizer  # heavy: loaded only when needed

        tokenizer: ChatTokenizer = AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError):
        return None
    return tokenizer
