"""The sharded model's full weights, one decoder layer at a time, for the engines and for export.

Weight sync and Hugging Face export need whole tensors under checkpoint names,
but no process may hold the whole model: every rank takes part in gathering one
shard unit (a decoder layer, or the root's embeddings, norm and head), the main
rank converts that part to checkpoint names and hands it on, and the next unit
is gathered only after the caller has consumed this one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

from roll_async.trainer.hf_names import to_checkpoint_names
from roll_async.trainer.parallel.process_group import RankInfo

_LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+)\.")


def shard_unit_of(name: str) -> str:
    """The decoder layer a state-dict name belongs to (``...layers.N``), or ``""`` for the root."""
    match = _LAYER_PREFIX.match(name)
    return match.group(1) if match else ""


def gathered_weight_chunks(
    model: torch.nn.Module, info: RankInfo, skip_names: set[str]
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield the full weights unit by unit under checkpoint names (CPU copies on the main rank, ``{}`` elsewhere).

    Collective: every rank must iterate to the end in step. ``skip_names`` are
    tied aliases (``lm_head.weight`` sharing the embedding), left out as in a
    saved checkpoint; they come from the model's declared tied keys
    (:func:`roll_async.trainer.checkpoint.tied_parameter_names`), never from
    storage pointers, which are all 0 on a meta-built model.
    """
    state = model.state_dict()
    units: dict[str, list[str]] = {}
    for name in state:
        if name not in skip_names:
            units.setdefault(shard_unit_of(name), []).append(name)
    for names in units.values():
        chunk: dict[str, torch.Tensor] = {}
        for name in names:
            tensor = state[name]
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()
            if info.is_main:
                chunk[name] = tensor.detach().to("cpu", copy=True)
        yield to_checkpoint_names(model, chunk) if info.is_main else {}
