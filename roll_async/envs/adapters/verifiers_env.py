"""verifiers environments (``env_type: verifiers:<env id>``): load one with the installed API, map a seed to a row.

verifiers ships two APIs and a venv holds one release, so the API is picked from the installed version:
below 0.4 the classic one (``verifiers_legacy``: ``vf.load_environment(env_id, **env_args)``, a dataset
and a Rubric), from 0.4 on ``verifiers.v1`` (``verifiers_v1``: a Taskset module played by a Harness).
Either way the rollout's model calls go to the OpenAI-compatible endpoint the caller hands in (the agent
gateway, so the history is token-exact), the rubric's reward is the episode reward and each reward
function's score a metric. The library is optional: a missing one, or an env id that cannot load, is a
one-line ``ConfigError`` naming the key and the install command (``VERIFIERS_INSTALL``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from roll_async.envs.adapters.verifiers_common import (
    VERIFIERS_INSTALL,
    VerifiersApi,
    VerifiersResult,
)
from roll_async.envs.adapters.verifiers_legacy import load_legacy_env
from roll_async.envs.adapters.verifiers_v1 import load_v1_env
from roll_async.errors import ConfigError

#: The env_type prefix, as in ``verifiers:<env id>``.
PREFIX = "verifiers"


class VerifiersEnv(Protocol):
    """A loaded verifiers environment: its rows, and one rollout of a row against an endpoint."""

    api: VerifiersApi
    num_rows: int

    async def rollout(
        self, row: int, client: Any, model: str, max_tokens: int
    ) -> VerifiersResult: ...


#: The one piece of module state: (env_type, env_config as JSON) -> the loaded env, one per process.
_LOADED: dict[tuple[str, str], VerifiersEnv] = {}
_LOAD_LOCK = threading.Lock()


def env_id_of(env_type: str, key: str) -> str:
    """``<env id>`` of ``verifiers:<env id>``; ConfigError naming ``key`` when it is empty."""
    prefix, sep, env_id = env_type.partition(":")
    if prefix != PREFIX or not sep or not env_id:
        raise ConfigError(
            f"{key}={env_type!r} names no verifiers environment; write 'verifiers:<module or env id>'"
        )
    return env_id


def verifiers_api(key: str) -> VerifiersApi:
    """The API of the installed verifiers (``legacy`` below 0.4, ``v1`` from 0.4); ConfigError when absent."""
    try:
        version = importlib.metadata.version("verifiers")
        importlib.import_module("verifiers")
    except (importlib.metadata.PackageNotFoundError, ImportError) as exc:
        raise ConfigError(
            f"{key} needs the package 'verifiers', which is not installed or does not import ({exc}); "
            f"install it with: {VERIFIERS_INSTALL}"
        ) from None
    major, minor = (int(part) for part in (version.split(".") + ["0"])[:2])
    return "legacy" if (major, minor) < (0, 4) else "v1"


def load_verifiers_env(
    env_type: str, env_config: Mapping[str, Any], key: str
) -> VerifiersEnv:
    """The environment ``env_type`` names with ``env_config`` as its arguments, loaded once per process.

    ``key`` is the config key to name in errors (``custom_envs.<Tag>.env_type``).
    """
    env_id = env_id_of(env_type, key)
    cache_key = (env_type, json.dumps(dict(env_config), sort_keys=True, default=str))
    with _LOAD_LOCK:
        loaded = _LOADED.get(cache_key)
        if loaded is None:
            if verifiers_api(key) == "legacy":
                loaded = load_legacy_env(env_id, dict(env_config), key)
            else:
                loaded = load_v1_env(env_id, dict(env_config), key)
            if loaded.num_rows < 1:
                raise ConfigError(
                    f"{key}: verifiers environment {env_id!r} has no dataset rows to play"
                )
            _LOADED[cache_key] = loaded
    return loaded


def row_for_seed(seed: int, num_rows: int) -> int:
    """The dataset row an episode plays: its group's seed modulo the row count, so a group shares one row."""
    return seed % num_rows
