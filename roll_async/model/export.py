"""``roll-async export``: a run's checkpoint as a plain Hugging Face model directory.

A checkpoint directory already holds ``save_pretrained`` weights, but also the
optimizer, the resume state and (after an SFT warm start) the KL reference, and
it may lack the tokenizer, the run's ``model.chat_template`` override or a
generation config; a LoRA run's checkpoint holds only the adapter, which export merges into the base
model (``merge_and_unload``). Exporting copies the model files, completes them from the
run's base model and config, and writes the result atomically (temp sibling,
then rename), so the output is what transformers, vLLM and ``roll-async
check-model`` load.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import yaml

from roll_async.errors import MissingFileError, OutputExistsError
from roll_async.model.check import read_chat_template
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trainer.checkpoint import (
    EXTRA_STATE_FILE,
    KL_REFERENCE_DIR,
    OPTIMIZER_FILE,
    RNG_FILE,
    TRAINER_STATE_FILE,
    is_checkpoint,
    list_checkpoints,
)
from roll_async.trainer.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    merge_adapter_into_model,
)

#: Checkpoint entries that are resume state, not part of the model.
RESUME_ONLY = frozenset(
    {OPTIMIZER_FILE, EXTRA_STATE_FILE, TRAINER_STATE_FILE, KL_REFERENCE_DIR}
)
#: Per-rank RNG states (``rng_rank<N>.pt``): resume state too.
RESUME_ONLY_PREFIX = RNG_FILE.split("{", 1)[0]


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """The checkpoint of ``step`` (default: the newest) of a run directory; a one-line MissingFileError if none."""
    root = Path(run_dir).expanduser()
    if is_checkpoint(root) and step is None:
        return root
    found = dict(list_checkpoints(root / "checkpoints") or list_checkpoints(root))
    if not found:
        raise MissingFileError(
            f"{str(run_dir)!r} holds no checkpoint (no step_N with {TRAINER_STATE_FILE} in it or in its "
            "checkpoints/); pass a run directory of roll-async train with checkpoint.save_interval > 0"
        )
    if step is None:
        return found[max(found)]
    if step not in found:
        raise MissingFileError(
            f"{str(run_dir)!r} has no checkpoint of step {step}; its checkpoints are of steps "
            f"{', '.join(str(s) for s in sorted(found))}"
        )
    return found[step]


def _run_model_settings(
    run_root: Path, checkpoint: Path
) -> tuple[str | None, str | None]:
    """``(base model path, chat template file)`` the run used: RUN_DIR/config.yaml, else the trainer state."""
    base = json.loads((checkpoint / TRAINER_STATE_FILE).read_text()).get("model_path")
    template = None
    config_file = run_root / "config.yaml"
    if config_file.is_file():
        model = (yaml.safe_load(config_file.read_text()) or {}).get("model") or {}
        template = model.get("chat_template")
    return base, template


def export_checkpoint(
    run_dir: str | Path, out: str | Path, step: int | None = None
) -> Path:
    """Write the checkpoint of ``step`` (default: newest) of ``run_dir`` to ``out`` as an HF model directory."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # heavy

    checkpoint = find_checkpoint(run_dir, step)
    target = Path(out).expanduser().resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise OutputExistsError(
            f"--out {str(out)!r} exists and is not empty; choose a new directory"
        )
    # RUN_DIR/checkpoints/step_N: the run's config.yaml is two levels up
    base, template_file = _run_model_settings(checkpoint.parent.parent, checkpoint)
    template = read_chat_template(template_file)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        adapter = (checkpoint / ADAPTER_CONFIG_FILE).is_file()
        # a LoRA run's checkpoint holds the adapter: merge it into the base model
        if adapter:
            if base is None:
                raise MissingFileError(
                    f"{str(checkpoint)!r} holds a LoRA adapter but its {TRAINER_STATE_FILE} names no base model "
                    "(model_path)"
                )
            merge_adapter_into_model(base, checkpoint).save_pretrained(tmp)
        for entry in checkpoint.iterdir():
            if (
                entry.name in RESUME_ONLY
                or entry.name.startswith(RESUME_ONLY_PREFIX)
                or entry.is_dir()
            ):
                continue
            if adapter and entry.name in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE):
                continue
            shutil.copy2(entry, tmp / entry.name)
        tokenizer: ChatTokenizer = (
            AutoTokenizer.from_pretrained(tmp)
            if (tmp / "tokenizer_config.json").is_file()
            else AutoTokenizer.from_pretrained(base)
        )
        if template is not None:
            tokenizer.chat_template = template
        tokenizer.save_pretrained(tmp)
        if not (tmp / "generation_config.json").is_file():
            try:
                generation = GenerationConfig.from_pretrained(base)
            except (OSError, TypeError):
                generation = GenerationConfig.from_model_config(
                    AutoConfig.from_pretrained(tmp)
                )
            generation.save_pretrained(tmp)
        if target.exists():
            target.rmdir()
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
