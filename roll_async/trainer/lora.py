"""LoRA on the trainer's model (peft): only adapter weights train, checkpoint and go to the engines.

``trainer.lora.rank > 0`` wraps the loaded HF model with peft adapters on ``trainer.lora.target_modules``
and freezes every base weight, so the optimizer (built from the parameters that need gradients) holds the
adapters alone. What a weight sync sends depends on ``trainer.lora.sync``:

* ``adapter`` (default): :func:`adapter_state_dict`, the adapter under peft's saved names; each engine
  replica writes it to a per-version directory and serves it as a vLLM LoRA request
  (``roll_async.engine.lora_adapters``). Measured working on vLLM 0.32's CPU build (PunicaWrapperCPU) and
  the path to use on GPU.
* ``merged``: :func:`merged_state_dict`, ``W + (alpha/rank)·B·A`` per adapted weight under the base
  model's HF names, synced exactly like full fine-tuning; for an engine that cannot serve LoRA.

The KL reference of a LoRA run is the base model with the adapters switched off
(:func:`adapters_off`), not a second copy of the weights. The frozen base is held in the compute
dtype (``trainer.param_dtype``), the adapters and their AdamW state in float32.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.distributed.tensor import DTensor

from roll_async.config.sections import LoraConfig
from roll_async.errors import CheckpointError, ConfigError
from roll_async.trainer.hf_names import checkpoint_state_dict
from roll_async.trainer.model_loading import empty_causal_lm

#: peft's file names in a saved adapter directory (and so in a LoRA run's checkpoints).
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: The one adapter a LoRA run trains (peft's default name).
ADAPTER_NAME = "default"

#: A model passed through unchanged in type (a peft model stays one).
ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def lora_enabled(config: LoraConfig) -> bool:
    return config.rank > 0


def peft_config(config: LoraConfig) -> Any:
    """peft's ``LoraConfig`` for ``trainer.lora`` (no bias, causal LM)."""
    from peft import LoraConfig as PeftLoraConfig  # heavy: loaded only with LoRA on

    return PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def adapter_config_json(config: LoraConfig, base_model_path: str) -> dict[str, Any]:
    """The ``adapter_config.json`` peft writes for this adapter (what vLLM reads to serve it)."""
    peft_cfg = peft_config(config)
    peft_cfg.base_model_name_or_path = base_model_path
    with tempfile.TemporaryDirectory() as tmp:
        peft_cfg.save_pretrained(tmp)
        written: dict[str, Any] = json.loads(
            (Path(tmp) / ADAPTER_CONFIG_FILE).read_text()
        )
        return written


def linear_module_names(model: torch.nn.Module) -> set[str]:
    """Last name parts of the model's ``nn.Linear`` modules (what ``target_modules`` can name)."""
    return {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


def check_target_modules(
    available: Iterable[str], target_modules: Iterable[str]
) -> None:
    """ConfigError naming ``trainer.lora.target_modules`` and the modules to choose from, if one is missing."""
    have = set(available)
    missing = [name for name in target_modules if name not in have]
    if missing:
        raise ConfigError(
            f"trainer.lora.target_modules: the model has no linear module named {', '.join(missing)}; "
            f"use some of {', '.join(sorted(have))}"
        )


def model_linear_module_names(
    model_path: str | os.PathLike[str], trust_remote_code: bool = False
) -> set[str]:
    """:func:`linear_module_names` of the architecture in ``model_path``, built on the meta device (no weights)."""
    return linear_module_names(
        empty_causal_lm(str(model_path), torch.float32, trust_remote_code)
    )


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> Any:
    """The model wrapped with peft adapters: base weights frozen, adapters trainable (B = 0: output unchanged)."""
    from peft import get_peft_model  # heavy: loaded only with LoRA on

    check_target_modules(linear_module_names(model), config.target_modules)
    return get_peft_model(model, peft_config(config))


def frozen_base_in(model: ModelT, dtype: torch.dtype) -> ModelT:
    """Cast the frozen (base) floating-point parameters to ``dtype``; the adapters stay float32.

    A frozen weight needs no float32 master copy: it never takes an optimizer
    step, and the forward computes in ``dtype`` anyway (autocast on one device,
    FSDP2's mixed-precision policy on ranks). Works on meta-device models too.
    """
    with torch.no_grad():
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype)
    return model


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under the names peft saves (``adapter_model.safetensors``), detached."""
    from peft import get_peft_model_state_dict

    return {
        name: tensor.detach()
        for name, tensor in get_peft_model_state_dict(
            model, adapter_name=ADAPTER_NAME
        ).items()
    }


def gathered_adapter_state_dict(
    model: torch.nn.Module, is_main: bool
) -> dict[str, torch.Tensor]:
    """fsdp2: :func:`adapter_state_dict` with every shard gathered, as CPU tensors on the main rank ({} elsewhere).

    Collective: every rank calls it (each adapter tensor is all-gathered in turn).
    The adapters are a small fraction of the model, so they are gathered whole.
    """
    gathered: dict[str, torch.Tensor] = {}
    for name, tensor in adapter_state_dict(model).items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if is_main:
            gathered[name] = tensor.to("cpu", copy=True)
    return gathered


def write_adapter(
    directory: Path,
    weights: dict[str, torch.Tensor],
    config: LoraConfig,
    base_model_path: str,
) -> None:
    """The two files of a saved peft adapter, from gathered weights (what ``save_pretrained`` writes)."""
    from safetensors.torch import save_file

    save_file(
        {name: t.contiguous() for name, t in weights.items()},
        str(directory / ADAPTER_WEIGHTS_FILE),
    )
    (directory / ADAPTER_CONFIG_FILE).write_text(
        json.dumps(adapter_config_json(config, base_model_path), indent=2)
    )


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Base + adapter merged, under the names ``checkpoint_state_dict`` gives the base model; nothing mutated.

    Each adapted weight becomes ``W + scale·B·A`` (peft's own ``get_delta_weight``); every other
    entry is the base tensor itself, so tied weights stay tied and are dropped as in a saved model.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
                weight = module.get_base_layer().weight
                deltas[f"{name}.weight"] = weight.detach() + module.get_delta_weight(
                    ADAPTER_NAME
                ).to(weight.dtype)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        state[plain] = deltas.get(plain, tensor.detach())
    return checkpoint_state_dict(base, state)


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """Forward passes inside run the base model (the KL reference of a LoRA run)."""
    with model.disable_adapter():
        yield


def load_adapter_weights(
    model: torch.nn.Module, directory: str | os.PathLike[str]
) -> None:
    """Copy a saved adapter (``adapter_model.safetensors``) into ``model`` in place (optimizer refs stay valid)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(directory) / ADAPTER_WEIGHTS_FILE
    if not file.is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} holds no {ADAPTER_WEIGHTS_FILE}: it was not written by a LoRA run "
            "(trainer.lora.rank > 0); resume it with trainer.lora.rank=0, or start this LoRA run afresh"
        )
    result = set_peft_model_state_dict(
        model, load_file(str(file)), adapter_name=ADAPTER_NAME
    )
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not match this LoRA model: missing {missing[:5]}, unexpected "
            f"{list(result.unexpected_keys)[:5]}; was it written with other trainer.lora settings?"
        )


def merge_adapter_into_model(
    base_model_path: str | os.PathLike[str],
    adapter_dir: str | os.PathLike[str],
    trust_remote_code: bool = False,
) -> Any:
    """The base model with the saved adapter merged in (peft ``merge_and_unload``): a plain HF model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        base_model_path, trust_remote_code=trust_remote_code, dtype=torch.float32
    )
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
