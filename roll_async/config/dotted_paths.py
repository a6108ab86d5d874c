"""``package.module:attr`` paths: the one resolver for user code named in a config (envs, agents, trainers).

It also knows the modules that moved when roll-async became one import package, so that a config naming an
old path fails at load with the new one instead of an ImportError inside a worker.
"""

from __future__ import annotations

import importlib
from typing import Any

from roll_async.errors import ConfigError

#: Old module -> new module, for modules a config may name (env_type, agent, trainer_cls).
MOVED_MODULES: dict[str, str] = {
    "env_managers.testing": "roll_async.testing.scripted_envs",
    "env_managers": "roll_async.env_managers",
    "pipelines": "roll_async.pipelines",
    "roll_async.engine.fake_engine": "roll_async.testing.fake_engine",
    "roll_async.protocol": "roll_async.trajectory",
    "roll_async.batching": "roll_async.trainer.collate",
    "roll_async.tokenization": "roll_async.prompts.prompt_builder",
    "roll_async.multimodal": "roll_async.prompts.images",
    "roll_async.trainer.placement": "roll_async.trainer.trainer_actor",
}
#: Names of env_managers.testing that moved to other test-aid modules.
_MOVED_TEST_AIDS = {
    "build_chatml_test_tokenizer": "roll_async.testing.chatml_tokenizer",
    "three_turn_agent": "roll_async.testing.agents",
    "history_rewriting_agent": "roll_async.testing.agents",
    "raising_agent": "roll_async.testing.agents",
    "idling_agent": "roll_async.testing.agents",
    "unservable_requests_agent": "roll_async.testing.agents",
}


def moved_path(path: str) -> str | None:
    """The new ``module:attr`` for a path that names a moved module, else None."""
    module_name, sep, attr = path.partition(":")
    for old in sorted(MOVED_MODULES, key=len, reverse=True):
        if module_name == old or module_name.startswith(old + "."):
            new_module = MOVED_MODULES[old] + module_name[len(old) :]
            if old == "env_managers.testing" and attr.split(".")[0] in _MOVED_TEST_AIDS:
                new_module = _MOVED_TEST_AIDS[attr.split(".")[0]]
            return new_module + sep + attr
    return None


def check_not_moved(path: str, key: str) -> None:
    """ConfigError naming the new path when ``path`` (the value of config key ``key``) names a moved module."""
    new = moved_path(path)
    if new is not None:
        raise ConfigError(f"{key}={path!r} names a module that moved: use {new!r}")


def resolve_dotted(path: str, what: str) -> Any:
    """The object ``package.module:attr.sub`` names; ConfigError prefixed with ``what`` (the config key) otherwise."""
    check_not_moved(path, what)
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{what}: cannot import module {module_name!r}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"{what}: module {module_name!r} has no attribute {attr!r}"
            )
        obj = getattr(obj, part)
    return obj
