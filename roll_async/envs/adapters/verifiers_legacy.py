"""Classic verifiers environments (verifiers < 0.4): ``vf.load_environment(env_id, **env_args)``, one rollout per episode.

The environment's dataset rows are the rows a seed picks; a rollout runs with our session's
``openai.AsyncOpenAI`` wrapped as verifiers' ``OpenAIChatCompletionsClient`` (verifiers refuses a raw
client), so every model call of its own message history goes through the agent gateway. A classic
``Environment`` installs SIGINT/SIGTERM handlers when it is built: roll-async keeps its own, putting them
back on the main thread (the guard used for user modules) and not letting them be installed off it.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from roll_async.config.dotted_paths import INTERRUPT_SIGNALS, interrupt_handlers_kept
from roll_async.envs.adapters.verifiers_common import (
    VerifiersApi,
    VerifiersEpisodeError,
    VerifiersResult,
    load_failure,
    rubric_metrics,
)
from roll_async.errors import RollAsyncError


class LegacyVerifiersEnv:
    """A classic ``Environment``: its dataset rows are the seeds' rows, its rubric scores each rollout."""

    api: VerifiersApi = "legacy"

    def __init__(self, env: Any, env_id: str) -> None:
        self.env = env
        self.env_id = env_id
        try:  # the train dataset (built on first use), else the eval one
            self.rows = env.get_dataset()
        except ValueError:
            self.rows = env.get_eval_dataset()
        self.num_rows = len(self.rows)

    async def rollout(
        self, row: int, client: Any, model: str, max_tokens: int
    ) -> VerifiersResult:
        """Run the row's rollout with ``client`` (an ``openai.AsyncOpenAI``) wrapped as verifiers' chat client."""
        vf = importlib.import_module("verifiers")
        output = await self.env.run_rollout(
            dict(self.rows[row]),
            vf.OpenAIChatCompletionsClient(client),
            model,
            {"max_tokens": max_tokens},
        )
        error = output.get("error")
        if error:
            detail = (
                error.get("error_chain_repr", error)
                if isinstance(error, dict)
                else error
            )
            raise VerifiersEpisodeError(
                f"verifiers environment {self.env_id!r} failed on row {row}: {detail}"
            )
        return VerifiersResult(
            reward=float(output["reward"]),
            metrics=rubric_metrics(output.get("metrics") or {}),
        )


def load_legacy_env(
    env_id: str, env_args: dict[str, Any], key: str
) -> LegacyVerifiersEnv:
    """``vf.load_environment(env_id, **env_args)`` with roll-async's interrupt handlers kept."""
    vf = importlib.import_module("verifiers")
    try:
        with interrupt_handlers_of_envs_kept(key, env_id):
            env = vf.load_environment(env_id, **env_args)
        return LegacyVerifiersEnv(env, env_id)
    except RollAsyncError:
        raise
    except Exception as exc:
        raise load_failure(env_id, key, exc) from exc


class _NoInterruptHandlers:
    """Stands in for the ``signal`` module inside verifiers' Environment off the main thread: SIGINT/SIGTERM
    handlers are not installed (``signal.signal`` would raise there), everything else is the real module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    @staticmethod
    def signal(signum: int, handler: Callable[..., Any] | int | None) -> Any:
        if signum in INTERRUPT_SIGNALS:
            return signal.getsignal(signum)
        return signal.signal(signum, handler)


_SIGNAL_SHIM_LOCK = threading.Lock()


@contextmanager
def interrupt_handlers_of_envs_kept(key: str, env_id: str) -> Iterator[None]:
    """Around building a classic verifiers env: roll-async's SIGINT/SIGTERM handlers stay in place.

    On the main thread the handlers the env installs are put back (``interrupt_handlers_kept``, the same
    guard as for user modules); off it (an EnvManager worker's loop) the env's module sees a ``signal``
    that skips those two, since ``signal.signal`` raises outside the main thread.
    """
    if threading.current_thread() is threading.main_thread():
        with interrupt_handlers_kept(key, f"verifiers:{env_id}"):
            yield
        return
    environment = importlib.import_module("verifiers.legacy.envs.environment")
    with _SIGNAL_SHIM_LOCK:
        original = getattr(environment, "signal")  # noqa: B009 - a module attribute mypy cannot see
        setattr(environment, "signal", _NoInterruptHandlers())  # noqa: B010
        try:
            yield
        finally:
            setattr(environment, "signal", original)  # noqa: B010
