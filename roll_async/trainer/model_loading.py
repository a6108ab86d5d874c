"""Building the trainer's HF model: whole on one device, or empty on every fsdp2 rank and filled from the main rank.

A rank that read the whole checkpoint before sharding would hold the full
float32 model in host memory, once per rank: eight ranks of a 7B policy on one
node ask for about 230 GB of RAM before the first step. So fsdp2 ranks build
the model on the meta device (no storage), shard it, and allocate only their
shards; the main rank alone reads the checkpoint and torch's
``set_model_state_dict(broadcast_from_rank0=True)`` sends each rank its part,
one tensor at a time. The same path serves the KL reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from roll_async.prompts.images import model_is_vision_language
from roll_async.trainer.parallel.process_group import RankInfo
from roll_async.trainer.parallel.sharding import fill_shards_from_main_rank


def _auto_class(model_path: str) -> Any:
    # transformers is heavy: loaded only when a model is.
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if model_is_vision_language(model_path):
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _dtype_kwargs(dtype: torch.dtype) -> dict[str, torch.dtype]:
    import transformers

    major = int(transformers.__version__.split(".")[0])
    return {"dtype" if major >= 5 else "torch_dtype": dtype}


def load_causal_lm(
    model_path: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool = False,
) -> Any:
    """An HF causal LM on ``device`` with dropout off."""
    model = (
        _auto_class(model_path)
        .from_pretrained(
            model_path, trust_remote_code=trust_remote_code, **_dtype_kwargs(dtype)
        )
        .to(device)
    )
    disable_dropout(model)
    return model


def empty_causal_lm(
    model_path: str, dtype: torch.dtype, trust_remote_code: bool = False
) -> Any:
    """The model of ``model_path``'s config on the meta device: its structure, no storage, no weights read."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = _auto_class(model_path).from_config(
            config, trust_remote_code=trust_remote_code, **_dtype_kwargs(dtype)
        )
    disable_dropout(model)
    return model


def load_into_shards(
    model: torch.nn.Module,
    model_path: str,
    info: RankInfo,
    trust_remote_code: bool = False,
    prepare: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
) -> None:
    """Give a sharded :func:`empty_causal_lm` model ``model_path``'s weights; every rank calls this together.

    The main rank reads the checkpoint on its CPU (the only whole copy on any
    rank) and frees it once every rank holds its shards. ``prepare`` is what was
    done to ``model`` before sharding (LoRA adapters), applied to the loaded copy
    so the two have the same parameters; the main rank's initial adapters are the
    ones every rank receives.
    """
    source = None
    if info.is_main:
        dtype = next(model.parameters()).dtype
        source = load_causal_lm(
            model_path, dtype, torch.device("cpu"), trust_remote_code
        )
        if prepare is not None:
            source = prepare(source)
    fill_shards_from_main_rank(model, source, info)


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout (modules and the attention-dropout attributes HF attention layers read)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            # a plain float attribute; nn.Module types attributes as tensors or modules
            module.attention_dropout = 0.0  # type: ignore[assignment]
    config = getattr(model, "config", None)
    if config is not None and isinstance(
        getattr(config, "attention_dropout", None), float
    ):
        config.attention_dropout = 0.0
