"""The offline tiny model: a random-init Qwen2 causal LM with a BPE tokenizer trained on env text.

Tests, demos and benchmarks need a model that runs anywhere without a hub or a
download, so this builds one: the tokenizer is trained on the project's own env
text, the weights are random (seeded), and the result is an ordinary HF model
directory that vLLM, transformers and the trainer all load, reused while its
build id is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from roll_async.model.tiny_build import (
    is_current_build,
    model_cache_dir,
    tiny_shape,
    write_model_dir,
)
from roll_async.model.tiny_tokenizer import train_tokenizer

#: Bump when the recipe (corpus, tokenizer or architecture) changes, so caches rebuild.
BUILD_ID = "tiny-qwen2-v1"


def default_tiny_model_dir() -> Path:
    """Where the tiny model lives unless told otherwise (``$ROLL_ASYNC_CACHE`` or ~/.cache/roll_async)."""
    return model_cache_dir() / BUILD_ID


def build_tiny_model(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Build (or reuse) the tiny model directory and return its path.

    head_dim is fixed at 64 because vLLM's CPU attention kernels reject smaller heads.
    """
    # torch and transformers are heavy: loaded only when a model is built.
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir) if out_dir is not None else default_tiny_model_dir()
    build_info = {
        "build_id": BUILD_ID,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "seed": seed,
    }
    if not force and is_current_build(out, build_info):
        return out

    tokenizer = train_tokenizer(vocab_size)
    config = Qwen2Config(
        **tiny_shape(len(tokenizer), hidden_size, num_layers),
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )

    return write_model_dir(out, build_info, model, tokenizer)
