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
from roll_async.multimodal import check_vision


def check_envs(config: PipelineConfig) -> None:
    """Build and reset one env per used tag; any error names ``custom_envs.<tag>``."""
    used = set(config.train_env_manager.tags)
    if config.val_env_manager.num_env_groups > 0:
        used |= set(config.val_env_manager.tags)
    for tag in sorted(used):
        spec = config.custom_envs[tag]
        try:
            env = make_env(spec.env_type, dict(spec.env_config))
            env.reset(seed=config.seed)
            close = getattr(env, "close", None)
            if callable(close):
                close()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"custom_envs.{tag}: {exc}") from None


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
