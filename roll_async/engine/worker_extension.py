"""Methods vLLM mixes into its worker processes (``worker_extension_cls``), to load synced weights.

A weight sync must replace the weights inside vLLM's worker processes exactly,
on CPU and GPU; vLLM's own reload path has gaps there (tied output heads on CPU,
warnings for layers that by design get no tensor) that these methods close.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

# vLLM and safetensors are imported inside the methods: this module is loaded into vLLM's workers.
if TYPE_CHECKING:
    import torch

#: vLLM's logger of the layerwise reload and its message (vllm/model_executor/model_loader/reload/layerwise.py).
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_FAILED_TO_LOAD = "%s: Failed to load weights"


class ExpectedReloadWarningFilter(logging.Filter):
    """Demote 'Failed to load weights' to DEBUG for layers that have no checkpoint entry by design.

    Reload warnings: vLLM's layerwise reload logs "<Layer>: Failed to load weights"
    for every layer that got no tensor from the reloaded checkpoint, and puts the
    layer's previous tensors back. Two layers never get one from us, by design:
    rotary embeddings (their cos/sin cache is computed, not a checkpoint entry) and,
    with tied embeddings, the ParallelLMHead (its weight is the embedding's, and is
    re-processed above). For exactly those two, the warning is expected and is
    demoted to DEBUG; the same warning for any other layer (a weight we failed to
    send) stays a warning.
    """

    def __init__(self, tied_lm_head: bool) -> None:
        super().__init__()
        self.tied_lm_head = tied_lm_head

    def expected(self, layer_name: str) -> bool:
        return layer_name.endswith("RotaryEmbedding") or (
            self.tied_lm_head and layer_name == "ParallelLMHead"
        )

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.msg == _FAILED_TO_LOAD
            and isinstance(record.args, tuple)  # the message's %-arguments
            and record.args
            and self.expected(str(record.args[0]))
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            logger = logging.getLogger(record.name)
            return logger.isEnabledFor(logging.DEBUG)
        return True


def install_reload_warning_filter(tied_lm_head: bool) -> ExpectedReloadWarningFilter:
    """Install the filter once on vLLM's reload logger (idempotent); returns it."""
    logger = logging.getLogger(_RELOAD_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, ExpectedReloadWarningFilter):
            existing.tied_lm_head = tied_lm_head
            return existing
    installed = ExpectedReloadWarningFilter(tied_lm_head)
    logger.addFilter(installed)
    return installed


class WeightSyncExtension:
    """Mixed into vLLM's Worker; ``self`` is the worker.

    Weights travel as safetensors bytes: collective_rpc would otherwise turn tensor
    arguments into nested lists. Loading goes through ``model_runner.reload_weights``
    because calling ``model.load_weights`` directly fails on the CPU backend.

    Tied output heads: with ``tie_word_embeddings`` the checkpoint has no
    ``lm_head.weight``, so the reload never touches the ``ParallelLMHead`` and never
    re-runs its ``process_weights_after_loading``. On the CPU backend that step
    pre-packs the head's weight for the GEMM kernel (``cpu_linear``), so the engine
    would keep sampling from the *initial* output head while the input embedding
    moved on. After each reload on CPU, every LM head is processed again (idempotent
    there: it re-packs the current weight). GPU is left as vLLM does it.
    """

    def roll_async_load_weights(self, payload: bytes | list[bytes]) -> int:
        """Load safetensors bytes, or a list of buckets, in ONE reload (a partial reload per bucket breaks the model)."""
        from safetensors.torch import load

        tensors: dict[str, torch.Tensor] = {}
        for blob in payload if isinstance(payload, list) else [payload]:
            tensors.update(load(blob))
        install_reload_warning_filter(_ties_word_embeddings(self.model_runner))  # type: ignore[attr-defined]
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(tensors.items()), is_checkpoint_format=True
        )
        _reprocess_lm_heads(self.model_runner.get_model())  # type: ignore[attr-defined]
        _reprepack_cpu_moe_experts(self.model_runner.get_model())  # type: ignore[attr-defined]
        return len(tensors)


def _ties_word_embeddings(model_runner: Any) -> bool:
    hf_config = getattr(getattr(model_runner, "model_config", None), "hf_config", None)
    text_config = getattr(hf_config, "get_text_config", lambda: hf_config)()
    return bool(
        getattr(text_config, "tie_word_embeddings", False)
        or getattr(hf_config, "tie_word_embeddings", False)
    )


def _reprocess_lm_heads(model: torch.nn.Module) -> None:
    """Re-derive each LM head's kernel-side weights (CPU pre-packing) from its current, possibly tied, weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return

    for module in model.modules():
        method: Any = getattr(module, "quant_method", None)
        if isinstance(module, ParallelLMHead) and hasattr(
            method, "process_weights_after_loading"
        ):
            method.process_weights_after_loading(module)


def _reprepack_cpu_moe_experts(model: torch.nn.Module) -> None:
    """Re-pack MoE expert weights for the CPU grouped-GEMM kernel after a reload.

    vLLM's unquantized MoE method runs the experts' ``process_weights_after_loading``
    (on CPU: pre-pack ``w13``/``w2`` into the kernel's layout) only when the kernel is
    first built; on a weight update it copies the new weights in the checkpoint layout
    into the packed storage, so the kernel reads garbage-shuffled experts (measured:
    0.2 nats engine-vs-trainer gap after a sync on the qwen3_moe zoo model, 1e-6 with
    this re-pack). GPU backends shuffle inside ``_setup_kernel`` and need nothing.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if (
            experts is not None
            and type(experts).__module__.endswith(".cpu_moe")
            and hasattr(module, "w13_weight")
        ):
            experts.process_weights_after_loading(module)
