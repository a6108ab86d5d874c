"""Adapters for env libraries users already have, as registry prefixes (``gymnasium:<EnvId>``, ``textarena:<EnvId>``, ``reasoning_gym:<task>``, ``gem:<env_id>``, ``openenv:<url or module:Class>``); the libraries are optional (``pip install 'roll-async[envs]'``, ``[gem]``, ``[openenv]``) and imported only when such an env is built, so a missing one is a one-line error naming the extra."""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Iterable
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.errors import ConfigError

#: The pip extra that installs every adapter's library.
ENVS_EXTRA = "roll-async[envs]"

#: registry prefix -> "module:Class" of its adapter (imported lazily).
ADAPTER_PREFIXES: dict[str, str] = {
    "gymnasium": "roll_async.envs.adapters.gymnasium_env:GymnasiumEnv",
    "textarena": "roll_async.envs.adapters.textarena_env:TextArenaEnv",
    "reasoning_gym": "roll_async.envs.adapters.reasoning_gym_env:ReasoningGymEnv",
    "gem": "roll_async.envs.adapters.gem_env:GemEnv",
    "openenv": "roll_async.envs.adapters.openenv_env:OpenEnvEnv",
}


def split_adapter_env_type(env_type: str) -> tuple[str, str] | None:
    """``("gymnasium", "FrozenLake-v1")`` for an adapter env_type, None for anything else."""
    prefix, sep, name = env_type.partition(":")
    if not sep or prefix not in ADAPTER_PREFIXES:
        return None
    if not name:
        raise ConfigError(
            f"env_type {env_type!r} names no env after '{prefix}:'; e.g. '{prefix}:{_EXAMPLES[prefix]}'"
        )
    return prefix, name


_EXAMPLES = {
    "gymnasium": "FrozenLake-v1",
    "textarena": "GuessTheNumber-v0",
    "reasoning_gym": "basic_arithmetic",
    "gem": "game:GuessTheNumber-v0-easy",
    "openenv": "http://127.0.0.1:8000' or 'openenv:my_envs.server:MyEnvironment",
}


def adapter_class(prefix: str) -> type[Any]:
    adapter: type[Any] = resolve_dotted(
        ADAPTER_PREFIXES[prefix], f"env_type prefix {prefix!r}"
    )
    return adapter


def make_adapter_env(env_type: str, env_config: dict[str, Any]) -> Any:
    """Build the adapter env named by ``env_type`` (``prefix:name``)."""
    split = split_adapter_env_type(env_type)
    assert split is not None, env_type
    prefix, name = split
    return adapter_class(prefix)(name, **env_config)


def import_optional(
    module: str,
    pip_name: str,
    env_type: str,
    extra: str = ENVS_EXTRA,
    install: str | None = None,
) -> Any:
    """Import an adapter's library or raise a ConfigError naming the extra (or the ``install`` command) that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        command = install or f"pip install '{extra}' (or pip install {pip_name})"
        raise ConfigError(
            f"env_type {env_type!r} needs the package {pip_name!r}, which is not installed ({exc}); "
            f"install it with: {command}"
        ) from None


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (a library's multi-line message, NLTK's boxed LookupError, folded)."""
    text = " ".join(re.sub(r"\*{3,}", " ", str(exc)).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unknown_name_error(
    kind: str, env_type: str, name: str, known: Iterable[str]
) -> ConfigError:
    """'unknown <kind> id' with the closest registered names, so a typo is one edit away."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if not close:
        lowered = name.lower().split("-")[0]
        close = [k for k in known if lowered and lowered in k.lower()][:5]
    hint = (
        f"close matches: {', '.join(close)}"
        if close
        else f"{len(known)} ids are registered"
    )
    return ConfigError(f"env_type {env_type!r}: unknown {kind} id {name!r}; {hint}")
