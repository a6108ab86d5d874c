"""``package.module:attr`` paths: the one resolver for user code named in a config (envs, agents, trainers)."""

from __future__ import annotations

import importlib
from typing import Any


def resolve_dotted(path: str, what: str) -> Any:
    """The object ``package.module:attr.sub`` names; ValueError prefixed with ``what`` (the config key) otherwise."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what}: cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
