"""Shared pieces of building an offline tiny model: where builds live, their shape, and writing them safely.

The text model, the vision-language model and the family zoo each build an
ordinary HF model directory the same way: into one cache root, reused when the
recorded build matches, and written beside the target then moved into place so
a crash never leaves a half-written model.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def model_cache_dir() -> Path:
    """Where built models live unless told otherwise (``$ROLL_ASYNC_CACHE`` or ~/.cache/roll_async)."""
    return Path(
        os.environ.get("ROLL_ASYNC_CACHE", Path.home() / ".cache" / "roll_async")
    )


def tiny_shape(
    vocab_size: int, hidden_size: int, num_layers: int, head_dim: int = 64
) -> dict[str, int]:
    """The size fields every tiny model shares (head_dim 64: vLLM's CPU attention rejects smaller heads)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=max(1, hidden_size // head_dim),
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=4096,
    )


def is_current_build(out: Path, build_info: dict[str, Any]) -> bool:
    """True when ``out`` holds a finished build with exactly ``build_info`` (so it is reused)."""
    info_path = out / "roll_async_build.json"
    try:
        return info_path.is_file() and json.loads(info_path.read_text()) == build_info
    except json.JSONDecodeError:
        return False


def write_model_dir(out: Path, build_info: dict[str, Any], *parts: object) -> Path:
    """``save_pretrained`` every part (model, tokenizer, processor) into ``out`` plus the build record; returns ``out``.

    Built beside the target and moved into place, so a crash never leaves a half-written model.
    Processes that build the same model at once (parallel test workers) take turns on a lock file,
    and one that finds the same build already in place keeps it: a model another process is
    reading is never deleted under it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for part in parts:
            part.save_pretrained(tmp)  # type: ignore[attr-defined]
        (tmp / "roll_async_build.json").write_text(json.dumps(build_info, indent=2))
        with open(out.parent / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_current_build(out, build_info):
                if out.exists():
                    shutil.rmtree(out)
                tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
