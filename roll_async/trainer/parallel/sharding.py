"""FSDP2 on an HF causal LM: one shard unit per decoder layer plus the root, exact gradient sums, and what each rank holds.

Per decoder layer is the unit every FSDP2 peer uses: a forward all-gathers one
layer at a time, so a rank's peak is its shard plus one gathered layer. The
reduction is a plain SUM in every unit with no divide factor, because the loss
each rank backwards is already its share of the full-batch loss
(:mod:`roll_async.trainer.parallel.data_parallel`); FSDP2's default average
would halve gradients at two ranks, and on gloo its pre-multiplied sum is not
available at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from roll_async.errors import ConfigError, InvalidInputError
from roll_async.trainer.parallel.process_group import RankInfo


def decoder_layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names HF marks as units not to split (``_no_split_modules``): the decoder layers."""
    for candidate in (model, getattr(model, "base_model", None)):
        while candidate is not None:
            names = getattr(candidate, "_no_split_modules", None)
            if names:
                return set(names)
            candidate = getattr(candidate, "model", None)
    raise ConfigError(
        f"{type(model).__name__} declares no _no_split_modules: cannot tell its decoder layers "
        "to shard them; use trainer.strategy=single"
    )


def shard_model(
    model: torch.nn.Module,
    info: RankInfo,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    *,
    trainable: bool = True,
) -> list[torch.nn.Module]:
    """Apply ``fully_shard`` to each decoder layer and to the root; return the units, layers first.

    Parameters stay float32 (the master weights); ``param_dtype`` is what a forward
    gathers and computes in, ``reduce_dtype`` what gradients are summed in.
    ``trainable=False`` (the KL reference) skips the gradient settings: it never
    runs backward.
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    layer_names = decoder_layer_classes(model)
    units = [m for m in model.modules() if type(m).__name__ in layer_names]
    for unit in units:
        fully_shard(unit, mesh=info.mesh, mp_policy=policy)
    fully_shard(model, mesh=info.mesh, mp_policy=policy)
    units.append(model)
    if trainable:
        for unit in units:
            assert isinstance(unit, FSDPModule)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return units


def fill_shards_from_main_rank(
    model: torch.nn.Module, source: torch.nn.Module | None, info: RankInfo
) -> None:
    """Allocate a meta-built sharded ``model`` on the rank's device and copy ``source``'s weights into it.

    ``source`` is the whole model, on the main rank only (None elsewhere): torch
    broadcasts its state dict a tensor at a time and each rank keeps its shard.
    Buffers are not sharded and some (rotary frequencies) are not in the state
    dict, so every buffer is broadcast from the main rank as well.
    """
    if info.is_main and source is None:
        raise InvalidInputError("the main rank must pass the loaded model as source")
    model.to_empty(device=info.device)
    set_model_state_dict(
        model,
        source.state_dict() if source is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    source_buffers = dict(source.named_buffers()) if source is not None else {}
    for name, buffer in model.named_buffers():
        if source is not None:
            buffer.copy_(source_buffers[name])
        dist.broadcast(buffer, src=0)


def local_bytes(tensors: Iterable[Any]) -> int:
    """Bytes this rank stores for ``tensors`` (a DTensor counts its local shard)."""
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def rank_memory(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, int]:
    """Parameter and optimizer-state bytes held by this rank."""
    optimizer_tensors = (
        value for state in optimizer.state.values() for value in state.values()
    )
    return {
        "parameter_bytes": local_bytes(model.parameters()),
        "optimizer_bytes": local_bytes(optimizer_tensors),
    }
