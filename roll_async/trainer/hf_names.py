"""Weights under the names ``save_pretrained`` writes: tied aliases dropped, transformers' conversions reverted.

Checkpoints, weight syncs (whole or gathered layer by layer under fsdp2), LoRA's merged
weights and exports all name weights the way vLLM and transformers load them; this is
the one place that naming is worked out.
"""

from __future__ import annotations

import re

import torch


def checkpoint_state_dict(
    model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The model's weights under the names ``save_pretrained`` writes (tied aliases dropped, conversions reverted).

    These are the names vLLM's ``reload_weights(is_checkpoint_format=True)``
    expects. With tied embeddings ``lm_head.weight`` is the same tensor as
    ``model.embed_tokens.weight`` and is left out, exactly as in the saved file.
    ``state``: tensors to name instead of ``model.state_dict()`` (same keys; LoRA's merged weights).
    """
    if state is None:
        state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    try:  # transformers >= 5: the exact helpers save_pretrained uses
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except (
        ImportError
    ):  # older transformers: the declared aliases (never storage: meta has none)
        tied = tied_parameter_names(model)
        return {name: tensor for name, tensor in state.items() if name not in tied}
    return to_checkpoint_names(model, remove_tied_weights_from_state_dict(state, model))


def to_checkpoint_names(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Module-name weights (tied aliases already dropped) under the names ``save_pretrained`` writes.

    transformers 5 may load some checkpoints into fused or renamed parameters;
    this reverts that, for the whole state dict or for one decoder layer's part
    of it (the sharded trainer gathers and converts a layer at a time).
    """
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    reverted: dict[str, torch.Tensor] = revert_weight_conversion(model, state)
    return reverted


def tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """State-dict names that alias another entry (e.g. a tied ``lm_head.weight``), as the model declares them.

    Read from what transformers ties, never from storage pointers: a model built
    on the meta device (fsdp2 ranks, roll_async.trainer.model_loading) has every
    ``data_ptr`` 0, and grouping by it once took 20 of the tiny model's 27 names
    for aliases (never synced, never exported). Each Hugging Face (sub)model
    declares its own, so a peft wrapper's prefixed names are found too.
    """
    names = list(model.state_dict())
    tied: set[str] = set()
    for prefix, module in model.named_modules():
        for key in _declared_tied_keys(module):
            pattern = f"{prefix}.{key}" if prefix else key
            tied.update(
                name for name in names if name == pattern or re.fullmatch(pattern, name)
            )
    return tied


def _declared_tied_keys(module: torch.nn.Module) -> list[str]:
    """The tied (target) names one Hugging Face model declares, relative to it; [] for any other module.

    transformers 5 expands them from the config into ``all_tied_weights_keys``
    (``{target: source}``). transformers 4 ties ``_tied_weights_keys`` (a list
    there) to the input embeddings when the text config's ``tie_word_embeddings``
    is set (``PreTrainedModel.tie_weights``).
    """
    expanded = getattr(module, "all_tied_weights_keys", None)
    if expanded is not None:
        return list(expanded)
    keys = getattr(module, "_tied_weights_keys", None)
    config = getattr(module, "config", None)
    if not keys or config is None:
        return []
    text_config = (
        config.get_text_config(decoder=True)
        if hasattr(config, "get_text_config")
        else config
    )
    if not getattr(text_config, "tie_word_embeddings", False):
        return []
    return list(keys)
