"""The offline tiny vision-language model: a random-init Idefics3 (SigLIP-style vision tower + Llama LM).

Vision tests and demos need a VL model that runs offline on the CPU build, and
Idefics3 is the family that can: Qwen2-VL/Qwen2.5-VL, LLaVA, Gemma3 and InternVL
need torchvision (in transformers' processors or vLLM's modules), which has no
build for this CPU torch, while vLLM's ``idefics3`` module and transformers'
``Idefics3Processor`` with its PIL image processor run the same architecture
without it.
"""

from __future__ import annotations

import os
from pathlib import Path

from roll_async.errors import InvalidInputError
from roll_async.model.tiny_build import (
    is_current_build,
    model_cache_dir,
    tiny_shape,
    write_model_dir,
)
from roll_async.model.tiny_tokenizer import train_tokenizer

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
    return model_cache_dir() / BUILD_ID


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
    """Build (or reuse) the tiny VL model directory (weights, tokenizer, processor) and return its path.

    The tokenizer is the tiny model's plus Idefics3's image tokens; with the defaults a 64x64 image in
    16-pixel patches, pixel-shuffled by 2, becomes ``<fake_token_around_image><global-img>`` + 4 x
    ``<image>`` + ``<fake_token_around_image>`` (7 ids). Heads are 64 wide in both towers (vLLM's CPU
    attention rejects 16).
    """
    # torch and transformers are heavy: loaded only when a model is built.
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
        raise InvalidInputError(
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

    tokenizer = train_tokenizer(vocab_size)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", *IMAGE_SPECIAL_TOKENS]}
    )
    head_dim = 64
    # pixel shuffle by scale_factor=2
    image_seq_len = (image_size // patch_size) ** 2 // 4
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
