"""The offline tiny vision-language model: a random-init Idefics3 (SigLIP-style vision tower + Llama LM).

Why Idefics3 and not Qwen2.5-VL: on the CPU build here torchvision cannot be
installed (PyPI's wheels link CUDA torch; ``operator torchvision::nms does not
exist``), and transformers' ``Qwen2_5_VLProcessor`` requires a video processor
whose base class needs torchvision, while vLLM's ``qwen2_vl``, ``qwen2_5_vl``,
``llava``, ``gemma3_mm`` and ``internvl`` modules import torchvision-backed image
processors at import time. vLLM's ``idefics3`` module and transformers'
``Idefics3Processor`` with its PIL image processor need no torchvision, and
both run the same architecture (checked: engine and HF forward agree).

The recipe: the byte-level BPE tokenizer of :mod:`roll_async.model.tiny` plus
Idefics3's image special tokens; 64x64 images in 16-pixel patches, pixel
shuffle by 2, so one image becomes ``<fake_token_around_image><global-img>``
+ 4 x ``<image>`` + ``<fake_token_around_image>`` (7 ids). Heads are 64 wide in
both towers (vLLM's CPU attention rejects 16).
"""

from __future__ import annotations

import os
from pathlib import Path

from roll_async.model.tiny import (
    _train_tokenizer,
    default_tiny_model_dir,
    is_current_build,
    tiny_shape,
    write_model_dir,
)

#: Bump when the recipe changes, so caches rebuild.
BUILD_ID = "tiny-idefics3-vl-v1"
#: The family name `roll-async make-tiny-model --family` takes for this model.
FAMILY = "idefics3_vl"

IMAGE_TOKEN = "<image>"
#: Idefics3's processor looks these up by name (row/col tags are used only when images are split into tiles).
IMAGE_SPECIAL_TOKENS = [
    "<fake_token_around_image>",
    IMAGE_TOKEN,
    "<end_of_utterance>",
    "<global-img>",
] + [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]


def default_tiny_vl_model_dir() -> Path:
    return default_tiny_model_dir().parent / BUILD_ID


def build_tiny_vl_model(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    image_size: int = 64,
    patch_size: int = 16,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Build (or reuse) the tiny VL model directory (weights, tokenizer, processor) and return its path."""
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    if image_size % (patch_size * 2):
        raise ValueError(
            f"image_size={image_size} must be a multiple of 2 * patch_size={2 * patch_size}"
        )
    out = Path(out_dir) if out_dir is not None else default_tiny_vl_model_dir()
    build_info = {
        "build_id": BUILD_ID,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "image_size": image_size,
        "patch_size": patch_size,
        "seed": seed,
    }
    if not force and is_current_build(out, build_info):
        return out

    tokenizer = _train_tokenizer(vocab_size)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", *IMAGE_SPECIAL_TOKENS]}
    )
    head_dim = 64
    image_seq_len = (
        image_size // patch_size
    ) ** 2 // 4  # pixel shuffle by scale_factor=2
    config = Idefics3Config(
        text_config=dict(
            model_type="llama",
            **tiny_shape(len(tokenizer), hidden_size, num_layers, head_dim),
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=num_layers,
            num_attention_heads=max(1, hidden_size // head_dim),
            image_size=image_size,
            patch_size=patch_size,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        scale_factor=2,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
        do_image_splitting=False,
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=image_seq_len,
        chat_template=tokenizer.chat_template,
    )

    write_model_dir(out, build_info, model, processor, tokenizer)
    return out


#: VL families users ask for that cannot run here, and why (so `--family` names the fix, not a stack trace).
UNAVAILABLE_VL_FAMILIES = {
    "qwen2_5_vl": "its processor and vLLM module need torchvision, which has no build for this CPU torch",
    "qwen2_vl": "its processor and vLLM module need torchvision, which has no build for this CPU torch",
    "llava": "vLLM's llava module imports the torchvision-backed Pixtral image processor",
}


def build_tiny_vl_family(
    family: str | None, out_dir: str | None = None, *, force: bool = False
) -> Path | None:
    """Build the VL model when ``family`` names it; None for any other family (a text family builds elsewhere)."""
    if family == FAMILY:
        return build_tiny_vl_model(out_dir, force=force)
    if family in UNAVAILABLE_VL_FAMILIES:
        raise SystemExit(
            f"--family {family}: {UNAVAILABLE_VL_FAMILIES[family]}; use --family {FAMILY} "
            "(a tiny Idefics3 vision-language model that vLLM CPU and transformers both run without torchvision)"
        )
    return None
