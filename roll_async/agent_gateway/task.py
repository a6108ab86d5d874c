"""What an agent function receives (``AgentTask``), how it is found, and what it may return."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.errors import ConfigError, InvalidInputError

if (
    TYPE_CHECKING
):  # the handle's module starts workspaces; agent tags without one never import it
    from roll_async.envs.swe.agent_workspace import AgentWorkspace


@dataclass
class AgentTask:
    """One episode's task, handed to ``agent(client, task)``.

    ``seed`` and ``env_config`` are the episode's (the group's seed, the tag's
    ``env_config`` merged with any dataset row), so an agent that builds an env
    from them plays the same instance as the rest of its group. ``model`` is the
    served model id to pass as ``model=``; ``max_tokens`` and ``max_steps`` are
    the per-call token cap and the number of calls allowed.

    With ``env_type: swe`` (and ``agent:``) the episode's task is a swe task
    whose workspace roll-async has already started: ``workspace`` is the handle
    to it (:class:`~roll_async.envs.swe.agent_workspace.AgentWorkspace`, also
    the Environment of a mini-swe-agent harness), ``workspace.instruction`` what
    the agent is to do. When the agent returns, the task's hidden tests score
    the workspace and that is the episode's reward: a reward the agent returns
    is ignored there (its ``metrics`` are kept), and returning None is fine.

    Attributes:
        seed: The episode's seed (its group's, shared by every episode of the group).
        env_config: The tag's ``env_config``, merged with the episode's dataset row if any.
        tag: The ``custom_envs`` tag the episode belongs to.
        group_id: The episode's group.
        episode_id: The episode's index within its group.
        model: The served model id, to pass as ``model=`` to the client.
        max_tokens: The token cap of one model call (the tag's ``max_tokens_per_step``).
        max_steps: How many model calls the episode may make (the tag's ``max_steps``).
        env_type: The tag's ``env_type`` (``agent``, ``swe`` for an agent in a swe task's workspace, or
            ``verifiers:<env id>`` for the built-in verifiers agent).
        workspace: ``env_type: swe``: the handle to the episode's workspace (``execute``, ``aexecute``,
            ``instruction``); None for other tags.
    """

    seed: int
    env_config: dict[str, Any] = field(default_factory=dict)
    tag: str = ""
    group_id: int = 0
    episode_id: int = 0
    model: str = ""
    max_tokens: int = 0
    max_steps: int = 0
    env_type: str = "agent"
    workspace: AgentWorkspace | None = None


#: ``async def agent(client, task)``: the client is whatever the agent's code calls the endpoint with (an openai
#: client), and what it returns is checked by :func:`agent_result`.
AgentFunction = Callable[[Any, AgentTask], Coroutine[Any, Any, object]]


def load_agent_function(path: str, key: str = "agent") -> AgentFunction:
    """Import ``pkg.module:function`` and check it is ``async def f(client, task)``; ConfigError names the fix."""
    module_name, sep, attr = (path or "").partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{key}={path!r} must be 'package.module:function' naming `async def function(client, task)`"
        )
    obj = resolve_dotted(path, f"{key}={path!r}")
    if not inspect.iscoroutinefunction(obj):
        raise ConfigError(
            f"{key}={path!r} is not an `async def` function; write `async def {attr}(client, task)`"
        )
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ConfigError(
            f"{key}={path!r} must accept two arguments (client, task)"
        ) from None
    agent: AgentFunction = obj
    return agent


def agent_result(value: Any) -> tuple[float, dict[str, float]]:
    """(reward, metrics) from what an agent returned: a number, or ``{"reward": x, "metrics": {...}}``."""
    metrics: dict[str, float] = {}
    if isinstance(value, dict):
        if "reward" not in value:
            raise InvalidInputError(
                f"the agent returned a dict without 'reward' (keys: {sorted(value)})"
            )
        metrics = agent_metrics(value)
        value = value["reward"]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(float(value))
    ):
        raise InvalidInputError(
            f"the agent returned {value!r}; return a finite float or {{'reward': float, 'metrics': {{...}}}}"
        )
    return float(value), metrics


def agent_metrics(value: Any) -> dict[str, float]:
    """The ``metrics`` of a dict an agent returned (none for anything else): an agent in a workspace, whose
    reward is the verifier's, may return None, a number (ignored), ``{"metrics": {...}}`` or its harness's dict."""
    if not isinstance(value, dict):
        return {}
    raw_metrics = value.get("metrics") or {}
    if not isinstance(raw_metrics, dict):
        raise InvalidInputError(
            f"the agent's 'metrics' must be a dict of numbers, got {type(raw_metrics).__name__}"
        )
    metrics: dict[str, float] = {}
    for name, metric in raw_metrics.items():
        if not isinstance(metric, (bool, int, float)):
            raise InvalidInputError(
                f"the agent's metric {name!r} is {metric!r}, not a number"
            )
        metrics[str(name)] = float(metric)
    return metrics


def served_model_name(model_path: str | None) -> str:
    """The model id the gateway serves: the model directory's name (the offline tiny model when none is set)."""
    return Path(model_path).name if model_path else "roll-async-tiny"
