"""The offline tiny reward model: the tiny policy's tokenizer and shape with a random one-label scoring head.

Tests and demos of rewards from models need a sequence-classification
checkpoint that loads anywhere without a download; this builds one next to the
tiny policy model, reused while its build record is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from roll_async.model import build_tiny_model
from roll_async.model.tiny_build import (
    is_current_build,
    model_cache_dir,
    write_model_dir,
)

#: Bump when the recipe changes, so caches rebuild.
REWARD_BUILD_ID = "tiny-qwen2-rm-v1"


def default_tiny_reward_model_dir() -> Path:
    return model_cache_dir() / REWARD_BUILD_ID


def build_tiny_reward_model(
    out_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, force: bool = False
) -> Path:
    """Build (or reuse) a random-init ``Qwen2ForSequenceClassification`` (num_labels=1, pad token set); its path."""
    # torch and transformers are heavy: loaded only when a model is built.
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    out = Path(out_dir) if out_dir is not None else default_tiny_reward_model_dir()
    policy_dir = build_tiny_model()
    build_info = {"build_id": REWARD_BUILD_ID, "policy": str(policy_dir), "seed": seed}
    if not force and is_current_build(out, build_info):
        return out
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    config = AutoConfig.from_pretrained(policy_dir)
    config.num_labels = 1
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config).to(torch.float32)
    return write_model_dir(out, build_info, model, tokenizer)
