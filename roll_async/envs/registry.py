"""Build envs by name: the registry of env classes and ``make_env``.

Configs name an env by ``env_type`` (a registered name, a dotted path
``package.module:ClassName``, or an adapter prefix such as ``gymnasium:<EnvId>``),
and this is the one place that turns that name and its ``env_config`` into an
instance, checking the config so a wrong key fails naming the accepted ones, and
building the inner env of a wrapper.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.config.sections import VERIFIERS_PREFIX
from roll_async.envs.adapters import (
    adapter_class,
    make_adapter_env,
    split_adapter_env_type,
)
from roll_async.envs.base import build_config
from roll_async.envs.code import CodeEnv
from roll_async.envs.countdown import CountdownEnv
from roll_async.envs.delayed import DelayedEnv
from roll_async.envs.faulty import FaultyEnv
from roll_async.envs.frozen_lake import FrozenLakeEnv
from roll_async.envs.longtail import LongTailEnv
from roll_async.envs.math_qa import MathQAEnv
from roll_async.envs.multiplayer.registry import check_seats
from roll_async.envs.retrieval_qa import RetrievalQAEnv
from roll_async.envs.sliding_puzzle import SlidingPuzzleEnv
from roll_async.envs.sokoban import SokobanEnv
from roll_async.envs.swe.env import SweEnv
from roll_async.envs.wrapper import EnvWrapper
from roll_async.errors import ConfigError, InvalidInputError, InvalidTypeError

#: The one piece of module state: registered name -> env class.
_REGISTRY: dict[str, type[Any]] = {
    "sokoban": SokobanEnv,
    "frozen_lake": FrozenLakeEnv,
    "sliding_puzzle": SlidingPuzzleEnv,
    "countdown": CountdownEnv,
    "retrieval_qa": RetrievalQAEnv,
    "delayed": DelayedEnv,
    "longtail": LongTailEnv,
    "faulty": FaultyEnv,
    "code": CodeEnv,
    "math": MathQAEnv,
    "swe": SweEnv,
}


def register_env(name: str, cls: type | None = None, *, overwrite: bool = False) -> Any:
    """Register ``cls`` under ``name``; without ``cls`` it returns a class decorator.

    Re-registering a name with a different class needs ``overwrite=True``, so two
    plugins cannot silently shadow each other.

    Args:
        name: The ``env_type`` a config uses for this env; non-empty, without ``:``.
        cls: The env class: any class with ``reset`` and ``step`` methods.
        overwrite: Replace a different class already registered under ``name``.

    Returns:
        ``cls`` itself, or, when ``cls`` is None, a decorator that registers the class it
        decorates.

    Raises:
        InvalidInputError: ``name`` is empty, contains ``:``, or is taken by another class
            (a ``ValueError``).
        InvalidTypeError: ``cls`` has no ``reset`` or ``step`` method (a ``TypeError``).
    """
    if cls is None:
        return lambda c: register_env(name, c, overwrite=overwrite)
    if not name or ":" in name:
        raise InvalidInputError(
            f"env name {name!r} must be non-empty and contain no ':' (that marks a dotted path)"
        )
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise InvalidTypeError(
            f"{cls!r} cannot be registered as env {name!r}: it has no {', '.join(missing)} method"
        )
    old = _REGISTRY.get(name)
    if old is not None and old is not cls and not overwrite:
        raise InvalidInputError(
            f"env name {name!r} is already registered to {old.__module__}.{old.__qualname__}; pass overwrite=True"
        )
    _REGISTRY[name] = cls
    return cls


def registered_envs() -> list[str]:
    return sorted(_REGISTRY)


def names_user_class(env_type: str) -> bool:
    """True when ``env_type`` is a ``package.module:Class`` path: user code, not a registered name or an adapter."""
    return (
        env_type not in _REGISTRY
        and ":" in env_type
        and not env_type.startswith(VERIFIERS_PREFIX)
        and split_adapter_env_type(env_type) is None
    )


def resolve_env_class(env_type: str) -> type[Any]:
    """The class for a registered name, an adapter prefix or a ``package.module:ClassName`` path."""
    if env_type in _REGISTRY:
        return _REGISTRY[env_type]
    if env_type.startswith(VERIFIERS_PREFIX):
        raise ConfigError(
            f"env_type {env_type!r} is a verifiers environment, played as an agent session of a custom_envs "
            "tag (its rollout drives the model itself); it has no env class to build here"
        )
    adapter = split_adapter_env_type(env_type)
    if adapter is not None:
        return adapter_class(adapter[0])
    if ":" in env_type:
        obj = resolve_dotted(env_type, f"env_type {env_type!r}")
        if not isinstance(obj, type):
            raise ConfigError(
                f"env_type {env_type!r} names {obj!r}, which is not a class"
            )
        check_seats(env_type, "env_type", env_class=obj)
        return obj
    check_seats(env_type, "env_type")
    raise ConfigError(
        f"unknown env_type {env_type!r}; registered envs: {', '.join(registered_envs())}; "
        "or give a dotted path 'package.module:ClassName' or an adapter 'gymnasium:<EnvId>', "
        "'textarena:<EnvId>', 'reasoning_gym:<task>', 'gem:<env_id>', 'openenv:<url or module:Class>', "
        "'verifiers:<module or env id>'"
    )


def make_env(env_type: str, env_config: Mapping[str, Any] | None = None) -> Any:
    """Build an env instance; bad names and unknown config keys raise ``ConfigError`` saying what is accepted.

    A class with a dataclass ``config_cls`` (every :class:`~roll_async.envs.base.BaseEnv`) gets its
    ``env_config`` checked against that dataclass; any other class is called with ``**env_config``, its
    keys checked against the constructor's signature. A :class:`~roll_async.envs.wrapper.EnvWrapper`
    gets the env its config names in ``inner_env_type`` / ``inner_env_config``, built here first.

    Args:
        env_type: A registered name, an adapter prefix (``gymnasium:<EnvId>``) or a dotted
            path ``package.module:ClassName``.
        env_config: The env's settings (a config's ``custom_envs.<Tag>.env_config``).

    Returns:
        A new env instance, not yet reset.

    Raises:
        ConfigError: ``env_type`` names no env, or ``env_config`` has a key the env does not
            accept (the message lists the accepted ones); a ``ValueError``.
    """
    if split_adapter_env_type(env_type) is not None:
        return make_adapter_env(env_type, dict(env_config or {}))
    cls = resolve_env_class(env_type)
    config_cls: type[Any] | None = getattr(cls, "config_cls", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls):
        config = build_config(config_cls, env_config, env_type)
        if issubclass(cls, EnvWrapper):
            inner = make_env(config.inner_env_type, dict(config.inner_env_config))
            return cls(inner, config)
        return cls(config)
    kwargs = dict(env_config or {})
    _check_kwargs(cls.__init__, kwargs, env_type)
    return cls(**kwargs)


def _check_kwargs(
    init: Callable[..., Any], kwargs: dict[str, Any], env_type: str
) -> None:
    params = list(inspect.signature(init).parameters.values())[1:]  # drop self
    required = [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name not in kwargs
    ]
    if required:
        # a config mistake, said here rather than as the TypeError the constructor call would raise
        raise ConfigError(
            f"{env_type} needs env_config key(s) {', '.join(required)}: its constructor has no default for them"
        )
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [
        p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    for key in kwargs:
        if key not in accepted:
            raise ConfigError(
                f"env_config key {key!r} is not accepted by {env_type}; accepted keys: {', '.join(accepted) or '(none)'}"
            )
