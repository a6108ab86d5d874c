"""``openenv:<url>`` / ``openenv:<module:Class>``: an OpenEnv environment behind the project's text env contract.

OpenEnv environments are servers with typed actions and observations; users who have
one should not have to port it. The adapter talks to it over OpenEnv's own WebSocket
client (one session per env: HTTP ``/reset`` and ``/step`` build a fresh env per call,
so they cannot hold an episode), builds the typed action from the model's reply in a
way the config chooses, and maps the typed observation, reward and done back to text,
reward and termination.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.envs.adapters import import_optional, one_line
from roll_async.envs.adapters.openenv_server import (
    LocalServerLease,
    acquire_local_server,
)
from roll_async.errors import ConfigError, EnvLibraryError, LifecycleError

#: The pip extra that installs OpenEnv.
OPENENV_EXTRA = "roll-async[openenv]"

#: Fields every OpenEnv action / observation carries; never the action's text field or the observation's text.
_BASE_FIELDS = frozenset({"metadata", "reward", "done"})


class OpenEnvEnv:
    """An OpenEnv environment, on a running server (``openenv:http://host:port``) or started here from its class.

    ``openenv:<url>`` connects to a running server; ``openenv:<package.module:Class>``
    starts the class (an ``openenv.core.env_server.Environment``) on a loopback server of
    this worker process, shared by the worker's envs of that class (its
    ``max_concurrent_envs`` is their number; a class without
    ``SUPPORTS_CONCURRENT_SESSIONS`` gets a server per env) and stopped when the last one
    closes. Each env holds one WebSocket session for its lifetime; ``reset(seed)`` sends
    ``seed`` (the server passes it when the env's ``reset`` takes it).

    env_config keys:

    * ``action_type`` (required): ``package.module:Class`` of the env's Action (pydantic).
    * ``observation_type``: its Observation class; required with a class, optional with a
      URL. When given, every observation the server sends is checked against it.
    * ``env_kwargs``: keyword arguments of the class's constructor (class form only).
    * How the action is built from the reply, first that applies:
      ``action_builder: package.module:function`` is called with the reply text and returns
      the Action (or a dict of its fields); otherwise the reply goes into one field,
      ``action_field`` (default: the Action's only required field, or its only field).
      ``action_pattern`` (a regex with one group, e.g. ``<answer>(.*?)</answer>``) first
      cuts that text out of the reply (last match). The field's type is pydantic's to check
      (``"7"`` becomes an int field's 7).
    * A reply that yields no action (no pattern match, the builder raised ``ValueError``,
      the fields failed validation) does not step the env: the turn costs
      ``format_penalty`` (default -0.1) and the observation repeats with the reason.
    * ``observation_field``: the observation field shown as text (default: the only field
      besides reward/done/metadata; with several, their JSON).
    * ``instruction``: the task text of the first turn (OpenEnv has no instruction).
    * ``success_reward`` (default 1.0): ``success`` is ``done and reward >= success_reward``.
    * ``connect_timeout_s`` (10), ``message_timeout_s`` (60): the WebSocket client's.

    Reward is the observation's (None counts 0), ``done`` is ``terminated``; ``truncated``
    is never set (``max_steps`` truncates). A server error or a dropped session raises
    :class:`~roll_async.errors.EnvLibraryError`, so the episode ends ``env_error``.
    """

    def __init__(
        self,
        target: str,
        *,
        action_type: str | None = None,
        observation_type: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        action_builder: str | None = None,
        action_field: str | None = None,
        action_pattern: str | None = None,
        observation_field: str | None = None,
        instruction: str = "",
        format_penalty: float = -0.1,
        success_reward: float = 1.0,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        self.env_type = env_type = f"openenv:{target}"
        import_optional(
            "openenv.core.env_client", "openenv-core", env_type, OPENENV_EXTRA
        )
        if not action_type:
            raise ConfigError(
                f"env_type {env_type!r} needs env_config.action_type: 'package.module:Class' of the env's "
                "Action (an openenv.core.env_server.Action subclass)"
            )
        self.action_cls = _load_class(action_type, "action_type", env_type)
        self.observation_cls = (
            _load_class(observation_type, "observation_type", env_type)
            if observation_type
            else None
        )
        self.builder: Callable[[str], Any] | None = (
            _load_callable(action_builder, env_type) if action_builder else None
        )
        self.action_field = (
            None
            if self.builder
            else _action_field(self.action_cls, action_field, env_type)
        )
        self.pattern = re.compile(action_pattern, re.DOTALL) if action_pattern else None
        if self.pattern is not None and self.pattern.groups != 1:
            raise ConfigError(
                f"env_type {env_type!r}: env_config.action_pattern {action_pattern!r} must have exactly one group"
            )
        self.observation_field = observation_field
        self.instruction = str(instruction)
        self.format_penalty = float(format_penalty)
        self.success_reward = float(success_reward)
        self._lease: LocalServerLease | None = None
        if "://" in target:
            if env_kwargs:
                raise ConfigError(
                    f"env_type {env_type!r}: env_config.env_kwargs builds a class, but this env_type is a URL; "
                    "remove env_kwargs or name the class ('openenv:package.module:Class')"
                )
            self.url = target
        else:
            env_cls = _load_class(target, "env_type", env_type)
            if self.observation_cls is None:
                raise ConfigError(
                    f"env_type {env_type!r} needs env_config.observation_type ('package.module:Class' of the "
                    "env's Observation) to serve the class"
                )
            self._lease = acquire_local_server(
                env_cls,
                self.action_cls,
                self.observation_cls,
                dict(env_kwargs or {}),
                env_type,
            )
            self.url = self._lease.url
        self.client = _make_client(
            self.url, float(connect_timeout_s), float(message_timeout_s)
        )
        try:
            self.client.connect()
        except ConnectionError as exc:
            self.close()
            raise ConfigError(
                f"env_type {env_type!r}: no OpenEnv server answers at {self.url} ({one_line(exc)}); start the "
                "server there or fix the URL in the env_type"
            ) from None
        self._observation: dict[str, Any] = {}
        self._done = True
        self.invalid_actions = 0

    # -- the env contract --------------------------------------------------------------

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        result = self._call("reset", seed=int(seed))
        self._observation = dict(result.observation or {})
        self._done = bool(result.done)
        self.invalid_actions = 0
        return self.render(), {"instruction": self.instruction, "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise LifecycleError(
                f"{self.env_type}: step() before reset() or after the episode ended; call reset()"
            )
        action, error = self.build_action(action_text)
        if action is None:
            self.invalid_actions += 1
            metrics = {
                "action_is_valid": False,
                "success": False,
                "invalid_actions": float(self.invalid_actions),
            }
            return (
                f"Invalid action: {error}\n{self.render()}",
                self.format_penalty,
                False,
                False,
                {"metrics": metrics},
            )
        result = self._call("step", action)
        self._observation = dict(result.observation or {})
        self._done = bool(result.done)
        reward = float(result.reward) if result.reward is not None else 0.0
        metrics = {
            "action_is_valid": True,
            "success": self._done and reward >= self.success_reward,
            "invalid_actions": float(self.invalid_actions),
        }
        return self.render(), reward, self._done, False, {"metrics": metrics}

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if self._lease is not None:
            self._lease.release()

    # -- mapping -------------------------------------------------------------------------

    def build_action(self, text: str) -> tuple[Any, str]:
        """``(Action, "")`` from the reply, or ``(None, why)`` when the reply yields no valid action."""
        from pydantic import ValidationError

        if self.pattern is not None:
            matches = self.pattern.findall(text)
            if not matches:
                return None, f"no match for {self.pattern.pattern} in the reply"
            text = matches[-1].strip()
        try:
            if self.builder is not None:
                built = self.builder(text)
                if isinstance(built, self.action_cls):
                    return built, ""
                return self.action_cls.model_validate(built), ""
            return self.action_cls.model_validate({self.action_field: text}), ""
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors()
            )
            return None, f"{self.action_cls.__name__} rejected it ({details})"
        except ValueError as exc:
            return None, str(exc)

    def render(self) -> str:
        """The observation as text: ``observation_field``, the only field, or the fields' JSON."""
        fields = {k: v for k, v in self._observation.items() if k not in _BASE_FIELDS}
        if self.observation_field is not None:
            if self.observation_field not in fields:
                raise ConfigError(
                    f"env_type {self.env_type!r}: env_config.observation_field {self.observation_field!r} is not "
                    f"in the observation; its fields: {', '.join(sorted(fields)) or '(none)'}"
                )
            return _text(fields[self.observation_field])
        if len(fields) == 1:
            return _text(next(iter(fields.values())))
        return json.dumps(fields, sort_keys=True, default=str)

    # -- internals -----------------------------------------------------------------------

    def _call(self, call: str, *args: Any, **kwargs: Any) -> Any:
        """One client call; a server error, a dropped session or an observation of the wrong shape is an
        EnvLibraryError naming the env. Returns the StepResult with the observation's fields as a dict."""
        try:
            result = getattr(self.client, call)(*args, **kwargs)
            if self.observation_cls is not None:
                # the declared type checks what the server sent (it leaves out reward, done, metadata)
                self.observation_cls.model_validate(result.observation or {})
        except Exception as exc:  # the server's RuntimeError, websockets' ConnectionClosed, pydantic's error
            hint = (
                "; the server is at max_concurrent_envs: raise it there or run fewer envs against it"
                if "CAPACITY_REACHED" in str(exc)
                else ""
            )
            raise EnvLibraryError(
                f"env_type {self.env_type!r}: {call} failed on the OpenEnv server at {self.url}: "
                f"{one_line(exc)}{hint}"
            ) from exc
        return result


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _load_class(path: str, key: str, env_type: str) -> type[Any]:
    obj = resolve_dotted(path, f"env_type {env_type!r}: {key} {path!r}")
    if not isinstance(obj, type):
        raise ConfigError(f"env_type {env_type!r}: {key} {path!r} is not a class")
    return obj


def _load_callable(path: str, env_type: str) -> Callable[[str], Any]:
    obj = resolve_dotted(path, f"env_type {env_type!r}: action_builder {path!r}")
    if not callable(obj):
        raise ConfigError(
            f"env_type {env_type!r}: action_builder {path!r} is not callable"
        )
    builder: Callable[[str], Any] = obj
    return builder


def _action_field(action_cls: type[Any], field: str | None, env_type: str) -> str:
    """The Action field the reply goes into: the configured one, or the one field that can hold it."""
    fields = {
        name: info
        for name, info in getattr(action_cls, "model_fields", {}).items()
        if name not in _BASE_FIELDS
    }
    if field is not None:
        if field not in fields:
            raise ConfigError(
                f"env_type {env_type!r}: env_config.action_field {field!r} is not a field of "
                f"{action_cls.__name__}; its fields: {', '.join(sorted(fields)) or '(none)'}"
            )
        return field
    required = [name for name, info in fields.items() if info.is_required()]
    candidates = required if required else list(fields)
    if len(candidates) != 1:
        raise ConfigError(
            f"env_type {env_type!r}: {action_cls.__name__} has fields {', '.join(sorted(fields)) or '(none)'}; "
            "set env_config.action_field to the one the reply goes into, or env_config.action_builder "
            "to a 'package.module:function' that builds the action from the reply"
        )
    return str(candidates[0])


def _make_client(url: str, connect_timeout_s: float, message_timeout_s: float) -> Any:
    """An ``EnvClient`` that keeps the observation as the JSON dict the server sends."""
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient

    class _JsonClient(EnvClient):  # type: ignore[misc]
        def _step_payload(self, action: Any) -> dict[str, Any]:
            payload: dict[str, Any] = action.model_dump()
            return payload

        def _parse_result(self, payload: dict[str, Any]) -> Any:
            return StepResult(
                observation=payload.get("observation") or {},
                reward=payload.get("reward"),
                done=bool(payload.get("done", False)),
            )

        def _parse_state(self, payload: dict[str, Any]) -> Any:
            return payload

    return _JsonClient(
        url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s
    )
