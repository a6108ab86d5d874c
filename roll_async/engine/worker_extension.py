"""Methods vLLM mixes into its worker processes (``worker_extension_cls``).

Weights travel as safetensors bytes: collective_rpc would otherwise turn tensor
arguments into nested lists. Loading goes through ``model_runner.reload_weights``
because calling ``model.load_weights`` directly fails on the CPU backend.
"""

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's Worker; ``self`` is the worker."""

    def roll_async_load_weights(self, payload: bytes) -> int:
        from safetensors.torch import load

        tensors = load(payload)
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(tensors.items()), is_checkpoint_format=True
        )
        return len(tensors)
