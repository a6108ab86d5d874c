"""``package.module:attr`` paths: the one resolver for user code named in a config (envs, agents, trainers).

A path that names nothing (no such module or attribute) is a config mistake, a ``ConfigError`` with a
did-you-mean; an exception raised by the user's module while it is imported, or by user code roll-async
calls (:func:`calling_user_code`), is the user's own, a ``UserCodeError`` raised from it, so it is shown
with its traceback. An import on the main thread keeps roll-async's SIGINT/SIGTERM handlers: a module that
sets its own at import time is undone, so Ctrl-C still stops a run at a safe point. It also knows the
modules that moved when roll-async became one import package, so that a config naming an old path fails
at load with the new one instead of an ImportError inside a worker.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from roll_async.config.field_checks import did_you_mean
from roll_async.errors import ConfigError, RollAsyncError, UserCodeError

logger = logging.getLogger(__name__)

#: The signals roll-async handles itself (roll_async.pipelines.interrupt): a user module may not take them.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

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
    """The object ``package.module:attr.sub`` names.

    Raises ``ConfigError`` prefixed with ``what`` (the config key) when the path names nothing, and
    ``UserCodeError`` from the original exception when importing the module raised.
    """
    check_not_moved(path, what)
    module_name, _, attr = path.partition(":")
    module = import_user_module(module_name, what)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise ConfigError(
                f"{what}: module {module_name!r} has no attribute {attr!r}.{did_you_mean(part, names)}"
            )
        obj = getattr(obj, part)
    return obj


def import_user_module(module_name: str, what: str) -> ModuleType:
    """Import a module a config names (``what``: the config key), keeping roll-async's interrupt handlers.

    A module that is not there (the path is wrong) is a ``ConfigError`` with a did-you-mean; anything the
    module raises while it runs, including an import of its own that fails, is a ``UserCodeError``.
    """
    if not module_name or module_name.startswith("."):
        raise ConfigError(
            f"{what}: {module_name!r} is not an absolute module name; write package.module:attr"
        )
    action = f"importing module {module_name!r}"
    try:
        with interrupt_handlers_kept(what, module_name):
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name + ".").startswith(missing + "."):
            raise ConfigError(
                f"{what}: cannot import module {module_name!r}: {exc}.{_similar_module(missing)}"
            ) from exc
        raise UserCodeError(what, action, exc) from exc
    except Exception as exc:
        raise UserCodeError(what, action, exc) from exc


@contextmanager
def calling_user_code(key: str, call: str) -> Iterator[None]:
    """Around a call into user code: what it raises becomes ``UserCodeError`` naming ``key``; roll-async's own pass."""
    try:
        yield
    except RollAsyncError:
        raise
    except Exception as exc:
        raise UserCodeError(key, f"calling {call}", exc) from exc


@contextmanager
def interrupt_handlers_kept(what: str, module_name: str) -> Iterator[None]:
    """On the main thread, put back any SIGINT/SIGTERM handler the import replaced (and say so).

    Off the main thread nothing can replace them: ``signal.signal`` raises there, and that error is the module's.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None and signal.getsignal(signum) != handler:
                signal.signal(signum, handler)
                logger.warning(
                    "%s: importing %r set a %s handler; roll-async put its own back "
                    "(Ctrl-C and SIGTERM stop a run at a safe point)",
                    what,
                    module_name,
                    signal.Signals(signum).name,
                )


def _similar_module(missing: str) -> str:
    """`` Did you mean 'x'?`` among the modules next to ``missing`` (its package's, or the top-level ones)."""
    parent = missing.rpartition(".")[0]
    if parent:
        package = sys.modules.get(parent)
        paths = getattr(package, "__path__", None)
        if paths is None:
            return ""
        names = [f"{parent}.{m.name}" for m in pkgutil.iter_modules(paths)]
    else:
        names = [m.name for m in pkgutil.iter_modules()]
    return did_you_mean(missing, names)
