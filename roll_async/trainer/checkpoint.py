"""Checkpoint directories: atomic writes, HF-format weights, a trainer's save and resume, and finding the one to resume from.

A run must resume after a crash from a checkpoint that is whole, and a
checkpoint should itself be a model vLLM or transformers can load; this module
writes, recognises, lists and prunes such directories, and saves and restores a
:class:`~roll_async.trainer.policy_model.PolicyModel` (weights, AdamW, KL
reference, RNG; DCP shards under fsdp2) with the trainer's counters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from roll_async.errors import CheckpointError, MissingFileError
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.runtime.tensor_groups import bytes_bounded_groups
from roll_async.trainer import lora as lora_adapters
from roll_async.trainer.hf_names import checkpoint_state_dict, tied_parameter_names
from roll_async.trainer.parallel.sharded_checkpoint import (
    check_resumable_by_fsdp2,
    has_reference,
    is_sharded_checkpoint,
    load_sharded,
    save_sharded,
)
from roll_async.trainer.parallel.weight_gather import gathered_weight_chunks
from roll_async.trainer.policy_model import PolicyModel

logger = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_STATE_FILE = "extra_state.pt"
#: Each rank's torch RNG state (the trainer draws no random numbers today; a custom loss or dropout would).
RNG_FILE = "rng_rank{rank}.pt"
#: Sub-directory holding the KL reference's weights when it is not model.path's (after an SFT warm start).
KL_REFERENCE_DIR = "kl_reference"
CHECKPOINT_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


# ---------------------------------------------------------------------------
# Writing and reading


def write_checkpoint(
    directory: str | os.PathLike[str],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    tokenizer: ChatTokenizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    extra_state: dict[str, Any] | None = None,
    reference_model: Any = None,
) -> Path:
    """Write a checkpoint directory atomically (temp sibling, then rename); replaces an existing one.

    A checkpoint is one directory (``<run>/checkpoints/step_<N>``) holding:

    * the HF model (``save_pretrained``: ``config.json`` + ``*.safetensors``) and the
      tokenizer, so the directory is itself a model vLLM or transformers can load;
    * ``optimizer.pt``: the optimizer state dict;
    * ``extra_state.pt``: whatever the caller passed (the pipeline's step and
      scheduler seed state), pickled with ``torch.save``;
    * ``rng_rank0.pt``: the torch RNG state;
    * ``trainer_state.json``: the trainer's step counters and config, for humans and
      for :func:`is_checkpoint` (it is what makes a directory a checkpoint).
    * ``kl_reference/model.safetensors`` when ``reference_model`` is given: the KL
      reference's weights (HF names), which resume restores (:func:`load_model_weights`).

    Everything is written into a hidden sibling directory that is renamed into
    place at the end, so a crash mid-save never leaves a half checkpoint where
    ``resume_from`` would find it. ``extra_state.pt`` is unpickled on load: only
    resume from checkpoints you wrote.
    """
    target = Path(directory).resolve()
    tmp = new_temp_sibling(target)
    try:
        model.save_pretrained(tmp)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if reference_model is not None:
            from safetensors.torch import (
                save_file,
            )  # loaded only when a reference is saved

            (tmp / KL_REFERENCE_DIR).mkdir()
            weights = {
                name: t.contiguous()
                for name, t in checkpoint_state_dict(reference_model).items()
            }
            save_file(weights, str(tmp / KL_REFERENCE_DIR / "model.safetensors"))
        save_rng_state(tmp)
        write_checkpoint_state(tmp, tokenizer, trainer_state, extra_state)
        swap_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_rng_state(directory: Path, rank: int = 0) -> None:
    """This process's torch RNG state (CPU, and CUDA when present) as ``rng_rank<rank>.pt``."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, directory / RNG_FILE.format(rank=rank))


def restore_rng_state(directory: Path, rank: int = 0) -> bool:
    """Restore this process's RNG state if the checkpoint has one for its rank (not when resumed at more ranks)."""
    file = directory / RNG_FILE.format(rank=rank)
    if not file.is_file():
        return False
    state = torch.load(file, weights_only=True)
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    return True


def new_temp_sibling(target: Path) -> Path:
    """A fresh hidden directory beside ``target`` to write a checkpoint into before it is renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))


def write_checkpoint_state(
    directory: Path,
    tokenizer: ChatTokenizer | None,
    trainer_state: dict[str, Any] | None,
    extra_state: dict[str, Any] | None,
) -> None:
    """The small files of a checkpoint: tokenizer, ``extra_state.pt`` and, last, ``trainer_state.json``."""
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    torch.save(dict(extra_state or {}), directory / EXTRA_STATE_FILE)
    state = {"format": CHECKPOINT_FORMAT, **(trainer_state or {})}
    (directory / TRAINER_STATE_FILE).write_text(
        json.dumps(state, indent=2, default=str)
    )


def swap_into_place(tmp: Path, target: Path) -> None:
    """Rename a finished ``tmp`` to ``target``, replacing an existing one only after the rename."""
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


#: Largest safetensors file write_hf_weights writes (as save_pretrained's default shard size).
HF_SHARD_BYTES = 5 << 30


def write_hf_weights(
    chunks: Iterable[dict[str, torch.Tensor]],
    directory: Path,
    model_config: Any,
    generation_config: Any = None,
    shard_bytes: int = HF_SHARD_BYTES,
) -> None:
    """Write weights that arrive in parts (one decoder layer at a time) as HF safetensors shards with an index.

    What ``save_pretrained`` writes, without one process ever holding the whole
    model: a shard is flushed once it reaches ``shard_bytes``.
    """
    from safetensors.torch import save_file  # loaded only when weights are written

    directory.mkdir(parents=True, exist_ok=True)
    files: list[tuple[str, list[str]]] = []
    total = 0
    named = (item for chunk in chunks for item in chunk.items())
    for shard in bytes_bounded_groups(named, shard_bytes):
        name = f"model-part-{len(files) + 1:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in shard.items()}, str(directory / name))
        files.append((name, list(shard)))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    count = len(files)
    weight_map: dict[str, str] = {}
    for index, (old, names) in enumerate(files, start=1):
        new = f"model-{index:05d}-of-{count:05d}.safetensors"
        (directory / old).rename(directory / new)
        weight_map.update(dict.fromkeys(names, new))
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps(index_file, indent=2, sort_keys=True)
    )
    model_config.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)


def read_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """All tensors of the (possibly sharded) safetensors files in ``directory``."""
    from safetensors.torch import load_file  # loaded only when weights are read

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise MissingFileError(
            f"checkpoint {str(directory)!r} holds no *.safetensors model weights"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def load_model_weights(model: Any, directory: str | os.PathLike[str]) -> None:
    """Copy the saved weights into ``model`` in place (so optimizer references stay valid)."""
    weights = read_weights(directory)
    expected = set(checkpoint_state_dict(model))
    if set(weights) != expected:
        # Names differ from the in-memory ones (a transformers weight conversion): let HF map them.
        # load_state_dict casts to our dtype
        weights = type(model).from_pretrained(directory).state_dict()
    result = model.load_state_dict(weights, strict=False)
    missing = set(result.missing_keys) - tied_parameter_names(model)
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}; was it written for another model?"
        )


def read_checkpoint_state(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trainer_state, extra_state)`` of a checkpoint directory."""
    path = Path(directory)
    if not is_checkpoint(path):
        raise MissingFileError(
            f"{str(path)!r} is not a checkpoint (no {TRAINER_STATE_FILE}); point resume_from at a run directory "
            "or one of its checkpoints/step_N directories"
        )
    trainer_state = json.loads((path / TRAINER_STATE_FILE).read_text())
    extra_file = path / EXTRA_STATE_FILE
    extra_state = (
        torch.load(extra_file, weights_only=False) if extra_file.is_file() else {}
    )
    return trainer_state, extra_state


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, directory: str | os.PathLike[str]
) -> bool:
    """Restore the optimizer if the checkpoint has its state; returns whether it did."""
    file = Path(directory) / OPTIMIZER_FILE
    if not file.is_file():
        return False
    optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))
    return True


# ---------------------------------------------------------------------------
# A trainer's checkpoint: its PolicyModel and counters


def save_trainer_checkpoint(
    policy: PolicyModel,
    directory: str | os.PathLike[str],
    counters: dict[str, Any],
    extra_state: dict[str, Any],
) -> None:
    """Write ``policy`` (weights, AdamW, a snapshot KL reference, RNG) and the trainer's ``counters``.

    Single: :func:`write_checkpoint`. fsdp2: every rank must call it (DCP
    shards, :func:`_save_sharded_checkpoint`).
    """
    trainer_state = _trainer_state(policy, counters)
    if policy.rank is not None:
        _save_sharded_checkpoint(
            policy, Path(directory).resolve(), trainer_state, extra_state
        )
        return
    write_checkpoint(
        directory,
        model=policy.model,
        optimizer=policy.optimizer,
        tokenizer=policy.tokenizer,
        trainer_state=trainer_state,
        extra_state=extra_state,
        reference_model=policy.ref_model
        if policy.reference_source == "snapshot"
        else None,
    )


def _trainer_state(policy: PolicyModel, counters: dict[str, Any]) -> dict[str, Any]:
    return {
        **counters,
        "model_path": policy.model_path,
        "trainer_config": dataclasses.asdict(policy.config),
        "kl_reference": policy.reference_source
        if policy.ref_model is not None
        else None,
        "world_size": policy.rank.world_size if policy.rank is not None else 1,
    }


def _save_sharded_checkpoint(
    policy: PolicyModel,
    target: Path,
    trainer_state: dict[str, Any],
    extra_state: dict[str, Any],
) -> None:
    """fsdp2: every rank writes its DCP shards; the main rank writes HF weights (layer by layer) and the rest.

    The directory is written beside the target and renamed into place by the
    main rank once every rank has finished, as for a single checkpoint; with
    several nodes the run directory must be on a shared filesystem.
    """
    rank = policy.rank
    assert rank is not None
    tmp = target.parent / f".{target.name}.tmp-sharded"
    if rank.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    reference = policy.ref_model if policy.reference_source == "snapshot" else None
    save_sharded(tmp, policy.model, policy.optimizer, reference)
    save_rng_state(tmp, rank.rank)
    if policy.lora:  # the adapter as peft saves it, like a single LoRA checkpoint
        adapter = lora_adapters.gathered_adapter_state_dict(policy.model, rank.is_main)
        if rank.is_main:
            lora_adapters.write_adapter(
                tmp, adapter, policy.config.lora, policy.model_path
            )
    else:
        chunks = gathered_weight_chunks(policy.model, rank, policy.tied_names)
        if rank.is_main:
            write_hf_weights(
                chunks,
                tmp,
                policy.model.config,
                getattr(policy.model, "generation_config", None),
            )
        else:
            for _ in chunks:
                pass
    if rank.is_main:
        write_checkpoint_state(tmp, policy.tokenizer, trainer_state, extra_state)
        swap_into_place(tmp, target)
    dist.barrier()


def load_trainer_checkpoint(
    policy: PolicyModel, directory: str | os.PathLike[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore ``policy``'s weights, optimizer, KL reference and RNG; returns ``(trainer_state, extra_state)``.

    A run dir means its newest checkpoint; the config's hyperparameters win over
    the saved optimizer's. A DCP checkpoint (written by fsdp2 at any number of
    ranks) loads under either strategy; a single checkpoint (HF weights +
    ``optimizer.pt``) only under single.
    """
    path = resolve_resume_dir(directory)
    trainer_state, extra_state = read_checkpoint_state(path)
    if policy.rank is not None:
        check_resumable_by_fsdp2(path, str(directory))
    if is_sharded_checkpoint(path):
        snapshot = trainer_state.get("kl_reference") == "snapshot"
        reference = policy.ref_model if snapshot and has_reference(path) else None
        load_sharded(path, policy.model, policy.optimizer, reference)
        policy.apply_config_hyperparameters()
    else:
        # a LoRA checkpoint holds the adapter (the base is model_path)
        if policy.lora:
            lora_adapters.load_adapter_weights(policy.model, path)
        else:
            load_model_weights(policy.model, path)
        if load_optimizer_state(policy.optimizer, path):
            policy.apply_config_hyperparameters()
    restore_rng_state(path, policy.rank.rank if policy.rank is not None else 0)
    _restore_reference(policy, path, trainer_state)
    return trainer_state, extra_state


def _restore_reference(
    policy: PolicyModel, path: Path, trainer_state: dict[str, Any]
) -> None:
    """The KL reference the checkpointed run used: its saved snapshot, else model.path's weights."""
    if policy.ref_model is None or policy.lora:
        return
    if trainer_state.get("kl_reference") == "snapshot":
        if not is_sharded_checkpoint(path):
            load_model_weights(policy.ref_model, path / KL_REFERENCE_DIR)
        policy.reference_source = "snapshot"
    elif (
        trainer_state.get("kl_reference") is None
        and policy.config.kl_coef > 0
        and (trainer_state.get("trainer_config") or {}).get("kl_coef", 0) > 0
    ):
        logger.warning(
            "checkpoint %s does not say which KL reference it used (an older checkpoint): the reference is "
            "model.path's weights, not a post-SFT snapshot",
            path,
        )


# ---------------------------------------------------------------------------
# Finding checkpoints


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / TRAINER_STATE_FILE).is_file()


def checkpoint_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Where the checkpoint of ``step`` lives under a ``checkpoints/`` root."""
    return Path(root) / f"step_{int(step)}"


def list_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints directly under ``root``, oldest first."""
    path = Path(root)
    if not path.is_dir():
        return []
    found = []
    for child in path.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and is_checkpoint(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def resolve_resume_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint ``resume_from`` means: the directory itself, or the newest one of a run/checkpoints dir."""
    given = Path(path).expanduser()
    if is_checkpoint(given):
        return given
    for root in (given / "checkpoints", given):
        found = list_checkpoints(root)
        if found:
            return found[-1][1]
    raise MissingFileError(
        f"resume_from={str(path)!r}: no checkpoint found (looked for {TRAINER_STATE_FILE} in it, and for "
        "step_N checkpoints in it and in its checkpoints/ folder)"
    )


def prune_checkpoints(root: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints under ``root``; returns what was removed."""
    found = list_checkpoints(root)
    doomed = (
        [p for _, p in found[: max(0, len(found) - max(keep_last, 0))]]
        if keep_last > 0
        else []
    )
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
