"""Turn the ``model.path`` a config names into a model directory or hub id the engine and trainer load.

Configs may leave the path unset or name an offline tiny model (``tiny``,
``tiny-vl``, or a zoo family as ``tiny-<family>``, e.g. ``tiny-qwen2_5`` whose
template renders tools), which is built on first use, or give a local directory
or a hub id; resolving them in one place makes a wrong path fail early with the
fix.
"""

from __future__ import annotations

from pathlib import Path

from roll_async.errors import MissingFileError
from roll_async.model.families import FAMILIES, build_family_model
from roll_async.model.tiny import build_tiny_model
from roll_async.model.tiny_vl import build_tiny_vl_model

#: ``model.path`` values that name a zoo family's tiny model: ``tiny-`` and the family.
FAMILY_PREFIX = "tiny-"


def resolve_model_path(path: str | None) -> str:
    """The model a config names: None means the tiny model (built if missing), ``tiny-<family>`` a zoo
    family's tiny model (built if missing); a local path must exist."""
    if path is None or path == "tiny":
        return str(build_tiny_model())
    if path == "tiny-vl":
        return str(build_tiny_vl_model())
    if path.startswith(FAMILY_PREFIX) and "/" not in path:
        family = path[len(FAMILY_PREFIX) :]
        if family not in FAMILIES:
            choices = ", ".join(
                ["tiny", "tiny-vl"] + [FAMILY_PREFIX + f for f in FAMILIES]
            )
            raise MissingFileError(
                f"model.path={path!r} names no offline tiny model; choose one of: {choices}"
            )
        return str(build_family_model(family))
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1
    expanded = Path(path).expanduser()
    if expanded.exists():
        if not (expanded / "config.json").is_file():
            raise MissingFileError(
                f"model.path={path!r} exists but has no config.json; point it at a Hugging Face model "
                "directory (save_pretrained output) or leave it unset for the offline tiny model"
            )
        return str(expanded.resolve())
    if looks_local:
        raise MissingFileError(
            f"model.path={path!r} does not exist; build the offline tiny model with "
            "`roll-async make-tiny-model` (and leave model.path unset) or point it at a local HF model directory"
        )
    return path  # a hub id: works only on a machine with internet access or a warm HF cache
