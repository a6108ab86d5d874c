"""verifiers >= 0.4 (``verifiers.v1``): a Taskset module's tasks are the rows, its harness plays one through our endpoint.

In 0.4 an environment is a Taskset (the data and the ``@reward``/``@metric`` scoring) played by a Harness (the
agent program), built by ``vf.load_environment(vf.resolve_env_config({"taskset": {"id": MODULE}, ...}))``.
Rollouts get no client object but a ``ModelContext`` naming an endpoint; the env's ``serving()`` runs a local
interception proxy that records each call on the trace and forwards the request unchanged to that endpoint
(roll-async's session URL), so the conversation the gateway sees is the harness's own. The env_config is
the EnvConfig minus the taskset id (``taskset:`` fields, ``agent:``, ``timeout:``...); the agent's runtime
defaults to ``subprocess`` (local) instead of verifiers' remote sandbox service, which needs an account.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from roll_async.config.dotted_paths import import_user_module
from roll_async.envs.adapters.verifiers_common import (
    VerifiersApi,
    VerifiersEpisodeError,
    VerifiersResult,
    load_failure,
    rubric_metrics,
)
from roll_async.errors import ConfigError, RollAsyncError

#: The env var verifiers reads the endpoint's API key from (the gateway accepts any key).
API_KEY_VAR = "ROLL_ASYNC_VERIFIERS_API_KEY"


class V1VerifiersEnv:
    """A ``verifiers.v1`` Env: its taskset's tasks are the rows; one episode per rollout."""

    api: VerifiersApi = "v1"

    def __init__(self, env: Any, env_id: str, tasks: list[Any]) -> None:
        self.env = env
        self.env_id = env_id
        self.tasks = tasks
        self.num_rows = len(tasks)
        #: ``env.serving()`` (the interception proxy): entered by the first running episode, left by the last.
        self._users = 0
        self._served: contextlib.AsyncExitStack | None = None
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        """``env.serving()`` entered once for the episodes running at once, left when the last one ends.

        The Env keeps the proxy of its latest ``serving()`` on itself and each episode picks it up when it
        starts, so one proxy per Env at a time is what the library expects, and it saves a proxy start per
        episode.
        """
        async with self._serving_lock():
            if self._users == 0:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self._served = stack
            self._users += 1
        try:
            yield
        finally:
            async with self._serving_lock():
                self._users -= 1
                if self._users == 0 and self._served is not None:
                    served, self._served = self._served, None
                    await served.aclose()

    def _serving_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def rollout(
        self, row: int, client: Any, model: str, max_tokens: int
    ) -> VerifiersResult:
        """Play task ``row`` with the harness, its model calls sent to ``client``'s base URL."""
        vf = importlib.import_module("verifiers.v1")
        os.environ.setdefault(API_KEY_VAR, str(client.api_key))
        ctx = vf.ModelContext(
            model=model,
            client=vf.EvalClientConfig(
                base_url=str(client.base_url).rstrip("/"), api_key_var=API_KEY_VAR
            ),
            sampling=vf.SamplingConfig(max_tokens=max_tokens),
        )
        async with self._serving():
            episode = await self.env.run_episode(self.tasks[row], ctx)
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if errors or not episode.ok or not episode.traces:
            detail = "; ".join(f"{e.type}: {e.message}" for e in errors) or "not ok"
            raise VerifiersEpisodeError(
                f"verifiers environment {self.env_id!r} failed on task {row}: {' '.join(detail.split())}"
            )
        trace = episode.traces[-1]
        scores = {
            name: reward.score
            for name, reward in trace.rewards.items()
            if reward is not None
        }
        scores.update({k: v for k, v in trace.metrics.items() if v is not None})
        return VerifiersResult(
            reward=float(trace.reward), metrics=rubric_metrics(scores)
        )


def load_v1_env(env_id: str, env_args: dict[str, Any], key: str) -> V1VerifiersEnv:
    """``vf.load_environment(vf.resolve_env_config(...))`` for the taskset module ``env_id``; its tasks listed."""
    vf = importlib.import_module("verifiers.v1")
    taskset_args = env_args.pop("taskset", None) or {}
    if not isinstance(taskset_args, dict):
        raise ConfigError(
            f"{key}: env_config.taskset must be a mapping of the taskset's config fields, got {taskset_args!r}"
        )
    agent = dict(env_args.pop("agent", None) or {})
    agent.setdefault("runtime", {"type": "subprocess"})
    try:
        taskset_id = _importable_id(env_id, key)
        raw = {
            "taskset": {**taskset_args, "id": taskset_id},
            "agent": agent,
            **env_args,
        }
        env = vf.load_environment(vf.resolve_env_config(raw))
        if not env.taskset.bounded:
            raise ConfigError(
                f"{key}: the taskset of verifiers environment {env_id!r} is unbounded; "
                "roll-async maps seeds to rows of a bounded taskset"
            )
        tasks = list(env.taskset)
    except RollAsyncError:
        raise
    except Exception as exc:
        raise load_failure(env_id, key, exc) from exc
    return V1VerifiersEnv(env, env_id, tasks)


def _importable_id(env_id: str, key: str) -> str:
    """The id verifiers' loader can import: a dotted module path is imported here and aliased top-level.

    verifiers 0.4 resolves a taskset id as ``verifiers.v1.tasksets.<id>`` or the top-level module ``<id>``,
    and a dotted id fails the first lookup; the alias (dots as ``__``) names the same module object.
    """
    if "." not in env_id:
        return env_id
    module = import_user_module(env_id, key)
    alias = env_id.replace(".", "__")
    sys.modules.setdefault(alias, module)
    return alias
