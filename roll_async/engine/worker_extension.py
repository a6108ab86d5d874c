"""Methods vLLM mixes into its worker processes (``worker_extension_cls``).

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

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's Worker; ``self`` is the worker."""

    def roll_async_load_weights(self, payload: bytes | list[bytes]) -> int:
        """Load safetensors bytes, or a list of buckets, in ONE reload (a partial reload per bucket breaks the model)."""
        from safetensors.torch import load

        tensors: dict = {}
        for blob in payload if isinstance(payload, list) else [payload]:
            tensors.update(load(blob))
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(tensors.items()), is_checkpoint_format=True
        )
        _reprocess_lm_heads(self.model_runner.get_model())  # type: ignore[attr-defined]
        return len(tensors)


def _reprocess_lm_heads(model) -> None:
    """Re-derive each LM head's kernel-side weights (CPU pre-packing) from its current, possibly tied, weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, ParallelLMHead) and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
