"""The offline tiny model: a random-init Qwen2 causal LM with a BPE tokenizer trained on env text.

No hub, no download: the tokenizer is trained here on texts rendered by the
project's own environments, the weights are random (seeded), and the result is
an ordinary HF model directory that vLLM, transformers and the trainer all load.
Building is idempotent: an existing directory with the same build id is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

#: Bump when the recipe (corpus, tokenizer or architecture) changes, so caches rebuild.
BUILD_ID = "tiny-qwen2-v1"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text every env shares: chat roles, answer/search tags, action words, digits, grid symbols.
_BASE_TEXT = """\
system user assistant
You are an agent solving a task step by step. Reply with your action inside <answer></answer>.
<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer>
<answer>up</answer> <answer>down</answer> <answer>left</answer> <answer>right</answer>
<search>query</search> <answer>answer</answer> <think>reasoning</think> <image>
Up || Down || Left || Right
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 20 25 50 100 + - * / ( ) = # _ . , : ; ! ? ' "
# _ O X P S G H F @ * √ . wall box target player goal hole frozen
The answer is correct. The answer is wrong. Invalid action. Your action was invalid.
reward: -0.1 1.0 10.0 success turn step
"""


def default_tiny_model_dir() -> Path:
    """Where the tiny model lives unless told otherwise (``$ROLL_ASYNC_CACHE`` or ~/.cache/roll_async)."""
    root = Path(
        os.environ.get("ROLL_ASYNC_CACHE", Path.home() / ".cache" / "roll_async")
    )
    return root / BUILD_ID


def tokenizer_training_corpus() -> list[str]:
    """Texts the tokenizer is trained on: the shared base text plus renders of every built-in env."""
    from roll_async.envs.corpus import sample_env_texts

    return [_BASE_TEXT] * 4 + sample_env_texts()


def _train_tokenizer(
    vocab_size: int,
    *,
    special_tokens: list[str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    bos_token: str | None = None,
    additional_special_tokens: list[str] | None = None,
    added_tokens: list[str] | None = None,
):
    """The byte-level BPE recipe; the defaults are the tiny Qwen2 model's, the family zoo passes its own tokens."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    special_tokens = SPECIAL_TOKENS if special_tokens is None else special_tokens
    additional = (
        ["<|im_start|>"]
        if additional_special_tokens is None
        else additional_special_tokens
    )

    tok = Tokenizer(models.BPE(unk_token=None))
    # Byte-level: every string round-trips, even characters the corpus never showed.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_training_corpus(), trainer=trainer)
    if (
        added_tokens
    ):  # ordinary (not special) added tokens, e.g. Qwen3's <think>: kept when decoding
        tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t in added_tokens]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token=pad_token,
        unk_token=None,
        bos_token=bos_token,
        additional_special_tokens=additional,
        chat_template=chat_template,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
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

    tokenizer = _train_tokenizer(vocab_size)
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


def is_current_build(out: Path, build_info: dict) -> bool:
    """True when ``out`` holds a finished build with exactly ``build_info`` (so it is reused)."""
    info_path = out / "roll_async_build.json"
    try:
        return info_path.is_file() and json.loads(info_path.read_text()) == build_info
    except json.JSONDecodeError:
        return False


def write_model_dir(out: Path, build_info: dict, *parts: object) -> Path:
    """``save_pretrained`` every part (model, tokenizer, processor) into ``out`` plus the build record; returns ``out``.

    Built beside the target and moved into place, so a crash never leaves a half-written model.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for part in parts:
            part.save_pretrained(tmp)  # type: ignore[attr-defined]
        (tmp / "roll_async_build.json").write_text(json.dumps(build_info, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(path: str | None) -> str:
    """The model a config names: None means the tiny model (built if missing); a local path must exist."""
    if path is None or path == "tiny":
        return str(build_tiny_model())
    if (
        path == "tiny-vl"
    ):  # the offline tiny vision-language model (roll_async.model.tiny_vl)
        from roll_async.model.tiny_vl import build_tiny_vl_model

        return str(build_tiny_vl_model())
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1
    expanded = Path(path).expanduser()
    if expanded.exists():
        if not (expanded / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={path!r} exists but has no config.json; point it at a Hugging Face model "
                "directory (save_pretrained output) or leave it unset for the offline tiny model"
            )
        return str(expanded.resolve())
    if looks_local:
        raise FileNotFoundError(
            f"model.path={path!r} does not exist; build the offline tiny model with "
            "`roll-async make-tiny-model` (and leave model.path unset) or point it at a local HF model directory"
        )
    return path  # a hub id: works only on a machine with internet access or a warm HF cache
