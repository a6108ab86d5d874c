"""Checks that need more than the schema (envs, model, tokenizer), run before any actor starts.

validate_config() covers rules between fields; this covers what only building the
pieces can tell: an env_config an env rejects, a model path that does not exist,
a tokenizer without a chat template. Each failure names the key and the fix.
"""

from __future__ import annotations

from typing import Any

from roll_async.config import ConfigError, PipelineConfig
from roll_async.envs import make_env
from roll_async.model.tiny import resolve_model_path
from roll_async.multimodal import (
    VisionInputError,
    VisionProcessor,
    is_vision_tag,
    model_is_vision_language,
    observation_encoder,
)


def used_tags(config: PipelineConfig) -> list[str]:
    """Tags that train or validation envs use, sorted."""
    used = set(config.train_env_manager.tags)
    if config.val_env_manager.num_env_groups > 0:
        used |= set(config.val_env_manager.tags)
    return sorted(used)


def check_envs(config: PipelineConfig) -> None:
    """Build and reset one env per used tag; any error names ``custom_envs.<tag>``."""
    for tag in used_tags(config):
        spec = config.custom_envs[tag]
        try:
            env = make_env(spec.env_type, dict(spec.env_config))
            env.reset(seed=config.seed)
            close = getattr(env, "close", None)
            if callable(close):
                close()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"custom_envs.{tag}: {exc}") from None


def check_vision(config: PipelineConfig, model_path: str) -> None:
    """Preflight for vision tags: a VL model, a processor that loads offline, env images it accepts.

    Raises ``ConfigError`` naming the key and the fix, before any actor starts.
    """
    tags = [tag for tag in used_tags(config) if is_vision_tag(config.custom_envs[tag])]
    if not tags:
        return
    key = f"custom_envs.{tags[0]}.env_config.render_mode"
    if not model_is_vision_language(model_path):
        raise ConfigError(
            f"{key}=vision needs a vision-language model, but model.path={config.model.path!r} ({model_path}) has no "
            "vision_config; set model.path: tiny-vl (roll-async make-tiny-model --family idefics3_vl) or a local VL model, "
            "or use render_mode: text"
        )
    try:
        vision = VisionProcessor.load(model_path, trust_remote_code=config.model.trust_remote_code)
    except Exception as exc:
        raise ConfigError(
            f"model.path={config.model.path!r}: the image processor of {model_path!r} cannot be loaded offline "
            f"({type(exc).__name__}: {exc}); save the processor (processor.save_pretrained) into the model directory"
        ) from None
    limit = dict(config.engine.engine_kwargs.get("limit_mm_per_prompt") or {}).get("image")
    for tag in tags:
        spec = config.custom_envs[tag]
        images_per_episode = spec.max_steps + 1
        if limit is not None and int(limit) < images_per_episode:
            raise ConfigError(
                f"engine.engine_kwargs.limit_mm_per_prompt.image={limit} is below the {images_per_episode} images an "
                f"episode of custom_envs.{tag} can hold (max_steps + 1); raise it"
            )
        env = make_env(spec.env_type, dict(spec.env_config))
        try:
            observation, _ = env.reset(seed=config.seed)
            encoder = observation_encoder(spec, vision)
            text = encoder.text(observation)
            encoder.encode(vision.tokenizer(text, add_special_tokens=False)["input_ids"], observation)
        except VisionInputError as exc:
            raise ConfigError(f"custom_envs.{tag}: {exc}") from None
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()


def load_checked_tokenizer(config: PipelineConfig, model_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
    except Exception as exc:  # transformers raises OSError/ValueError/... for unusable paths
        raise ConfigError(f"model.path={config.model.path!r}: cannot load a tokenizer from {model_path!r}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"model.path={config.model.path!r}: the tokenizer has no chat template; multi-turn prompts need one "
            "(use an instruct/chat model or the offline tiny model)"
        )
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"model.path={config.model.path!r}: the tokenizer defines no eos token")
    return tokenizer


def preflight(config: PipelineConfig) -> tuple[str, Any]:
    """Run every pre-actor check; returns the resolved model path and its tokenizer."""
    check_envs(config)
    try:
        model_path = resolve_model_path(config.model.path)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    tokenizer = load_checked_tokenizer(config, model_path)
    check_vision(config, model_path)
    return model_path, tokenizer
