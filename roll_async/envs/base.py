"""The environment contract shared by every env: a small gym-like base class and its config.

Every part of the rollout (env managers, env servers, process isolation,
datasets) talks to envs through this one text-first contract, so a new env only
fills in the task: parse the action, apply it, render the state.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

from PIL import Image

from roll_async.config.field_checks import from_mapping
from roll_async.envs.parsing import ActionParser, ParsedAction
from roll_async.errors import (
    ConfigError,
    InvalidTypeError,
    LifecycleError,
    RollAsyncError,
)

RENDER_MODES = ("text", "vision")


class InvalidAction(RollAsyncError):
    """Raised by an env's ``_apply`` when a well-tagged action breaks the task's rules (a format error)."""


@dataclass
class Observation:
    """A multimodal observation: ``text`` holds one image placeholder per entry of ``images``.

    Attributes:
        text: The observation's text, with one ``image_placeholder`` per image.
        images: The images, in placeholder order.
    """

    text: str
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class EnvConfig:
    """Settings every built-in env accepts; each env extends it with its own fields."""

    #: Turns (``step`` calls) before the episode is truncated.
    max_steps: int = 20
    #: ``text`` (default) or ``vision`` (an image plus a text placeholder; grid envs only).
    render_mode: str = "text"
    #: Reward for a turn whose action is missing or not valid (added once per turn).
    format_penalty: float = -0.1
    #: Regex with one capture group around the action; the last match in a response wins.
    action_pattern: str = r"<answer>(.*?)</answer>"
    #: Splits several actions given in one turn (grid envs only).
    action_separator: str = ","
    #: At most this many actions run per turn; extra ones are dropped and counted.
    max_actions_per_turn: int = 1
    #: Placeholder put in the observation text for each image (vision mode).
    image_placeholder: str = "<image>"

    def __post_init__(self) -> None:
        if self.render_mode not in RENDER_MODES:
            raise ConfigError(
                f"render_mode={self.render_mode!r} is not one of {list(RENDER_MODES)}"
            )
        if int(self.max_steps) < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if int(self.max_actions_per_turn) < 1:
            raise ConfigError(
                f"max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}"
            )
        self.max_steps = int(self.max_steps)
        self.max_actions_per_turn = int(self.max_actions_per_turn)
        self.format_penalty = float(self.format_penalty)


def build_config(config_cls: type, env_config: Any, env_name: str = "") -> Any:
    """Turn a dict (or an instance) into ``config_cls``, naming any key it does not accept."""
    if (
        env_config is not None
        and not isinstance(env_config, config_cls)
        and not dataclasses.is_dataclass(env_config)
        and not hasattr(env_config, "keys")
    ):
        raise InvalidTypeError(
            f"env_config for {env_name or config_cls.__name__} must be a mapping, got {type(env_config).__name__}"
        )
    return from_mapping(
        config_cls, env_config, "env_config", env_name or config_cls.__name__
    )


class BaseEnv:
    """Base for built-in envs: config handling, action parsing, and the turn/termination bookkeeping.

    Subclasses set ``config_cls`` and implement ``_reset``, ``_apply`` (one parsed
    action), ``render_text``, ``instruction`` and optionally ``render_image`` and
    ``solve``. ``action_words`` lists the canonical action names for envs with a
    fixed action set (empty for free-form answers).

    Envs are text-first. ``reset(seed)`` returns ``(observation, info)`` with
    ``info["instruction"]`` holding the task text for the first turn; ``step(text)``
    takes the model's raw response, parses the action out of it (see
    :mod:`roll_async.envs.parsing`) and returns ``(observation, reward, terminated,
    truncated, info)`` with ``info["metrics"]``. A malformed response is the model's
    mistake, not the program's: it costs ``format_penalty`` and is reported in the
    metrics, never raised. Calling ``step`` before ``reset`` or after the episode
    ended is the caller's mistake and raises ``LifecycleError`` (a ``RuntimeError``).

    Everything random derives from the seed given to ``reset``, so one env object
    can be reused across episodes and a seed reproduces an episode exactly. Env
    objects hold only their own state, so many can run in worker threads at once.
    """

    config_cls: ClassVar[type] = EnvConfig
    action_words: ClassVar[tuple[str, ...]] = ()
    render_modes: ClassVar[tuple[str, ...]] = ("text",)
    #: Whether one turn may carry several actions joined by ``action_separator``.
    multi_action: ClassVar[bool] = True

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        if kwargs:
            if config is not None:
                raise InvalidTypeError(
                    "pass either a config or keyword arguments, not both"
                )
            config = kwargs
        self.config = build_config(self.config_cls, config, type(self).__name__)
        if self.config.render_mode not in self.render_modes:
            raise ConfigError(
                f"{type(self).__name__} does not support render_mode={self.config.render_mode!r}; "
                f"supported: {list(self.render_modes)}"
            )
        self.parser = ActionParser(
            pattern=self.config.action_pattern,
            separator=self.config.action_separator if self.multi_action else "",
            max_actions=self.config.max_actions_per_turn if self.multi_action else 1,
            valid_actions=self.action_words or None,
        )
        self.seed: int | None = None
        self.num_steps = 0
        self.done = True
        self.success = False
        self._started = False

    # ---- public API -----------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str | Observation, dict[str, Any]]:
        """Start an episode; everything random in it derives from ``seed``.

        Args:
            seed: The episode's seed; the same seed gives the same episode.

        Returns:
            ``(observation, info)``: the first observation (text, or an
            :class:`Observation` in vision mode) and ``info`` with ``instruction`` (the
            task text), ``seed`` and, for tool-using envs, ``tools``.
        """
        self.seed = int(seed)
        self.num_steps = 0
        self.done = False
        self.success = False
        self._started = True
        self._reset(self.seed)
        info: dict[str, Any] = {"instruction": self.instruction(), "seed": self.seed}
        tools = self.tools()
        if tools:
            info["tools"] = tools
        return self.render(), info

    def step(
        self, action_text: str
    ) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]:
        """Play one turn: parse the actions out of the model's reply and apply them.

        Args:
            action_text: The model's raw reply; a malformed one costs ``format_penalty``.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info["metrics"]``
            holds the per-step metrics (``success``, ``action_is_valid``, ...).

        Raises:
            LifecycleError: ``step`` was called before ``reset`` or after the episode ended (a
                ``RuntimeError``).
        """
        if not self._started:
            raise LifecycleError(f"{type(self).__name__}.step() called before reset()")
        if self.done:
            raise LifecycleError(
                f"{type(self).__name__}.step() called after the episode ended; call reset()"
            )
        parsed = self._parse(action_text)
        self.num_steps += 1
        reward = 0.0
        effective = False
        feedback: list[str] = []
        executed: list[str] = []
        for action in parsed.actions:
            try:
                r, changed, note = self._apply(action)
            except InvalidAction as e:
                parsed.is_valid, parsed.error = False, str(e)
                break
            reward += r
            effective = effective or changed
            executed.append(action)
            if note:
                feedback.append(note)
            if self.done:
                break
        if not parsed.is_valid:
            reward += self.config.format_penalty
            feedback.insert(0, self._format_feedback(parsed))
        terminated = self.done
        truncated = False
        if not terminated and self.num_steps >= self.config.max_steps:
            truncated = True
            self.done = True
        metrics: dict[str, float | bool] = {
            "action_is_valid": parsed.is_valid,
            "action_is_effective": effective,
            "success": self.success,
            "num_actions": float(len(executed)),
            "num_actions_dropped": float(parsed.num_dropped),
        }
        metrics.update(self.extra_metrics())
        info = {"metrics": metrics, "actions": executed, "format_error": parsed.error}
        return (
            self.render("\n".join(feedback)),
            float(reward),
            terminated,
            truncated,
            info,
        )

    def close(self) -> None:
        """Nothing to free for the built-ins; kept for the gym contract."""

    def render(self, feedback: str = "") -> str | Observation:
        """The observation for the current state, with an optional feedback line first."""
        prefix = f"{feedback}\n" if feedback else ""
        if self.config.render_mode == "vision":
            return Observation(
                text=prefix + self.config.image_placeholder,
                images=[self.render_image()],
            )
        return prefix + self.render_text()

    def solve(self) -> list[str] | None:
        """Actions (plain words, unwrapped) that reach success from the current state, or None."""
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def expert_responses(self) -> list[str] | None:
        """Whole model responses, one per turn, that follow :meth:`solve` (for SFT demonstrations)."""
        plan = self.solve()
        if plan is None:
            return None
        k = self.config.max_actions_per_turn if self.multi_action else 1
        return [
            self.parser.wrap(self.join_actions(plan[i : i + k]))
            for i in range(0, len(plan), k)
        ]

    def join_actions(self, actions: list[str]) -> str:
        """Several actions of one turn as the model should write them (``Up, Left`` or ``Up || Left``)."""
        sep = self.config.action_separator
        mark = sep.strip()
        glue = sep if not mark else (f"{mark} " if mark in ",;" else f" {mark} ")
        return glue.join(actions)

    def tools(self) -> list[dict[str, Any]] | None:
        """OpenAI function tools this env takes its actions through (None: actions are tagged text).

        When set, ``reset`` puts them in ``info["tools"]``, the rollout declares them through the
        chat template, and ``step`` receives the parsed calls as
        :func:`roll_async.envs.tool_actions.encode_tool_calls` text (or the raw reply when the
        model made no call).
        """
        return None

    # ---- for subclasses -------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        raise NotImplementedError

    def _parse(self, action_text: str) -> ParsedAction:
        """Find the actions in a response; envs with more than one tag (tool use) override this."""
        return self.parser.parse(action_text)

    def _apply(self, action: str) -> tuple[float, bool, str]:
        """Run one parsed action: return (reward, state changed, feedback line or ''); set done/success.

        Raise :class:`InvalidAction` when the action is well tagged but breaks the task's rules.
        """
        raise NotImplementedError

    def extra_metrics(self) -> dict[str, float | bool]:
        """Env-specific per-step metrics, merged into ``info["metrics"]``."""
        return {}

    def render_text(self) -> str:
        """The current state as text (subclasses implement it)."""
        raise NotImplementedError

    def render_image(self) -> Image.Image:
        """The current state as an image, for ``render_mode: vision`` (grid envs implement it)."""
        raise NotImplementedError(f"{type(self).__name__} has no image render")

    def instruction(self) -> str:
        """The task text of the first turn, put in ``info["instruction"]`` (subclasses implement it)."""
        raise NotImplementedError

    def answer_format(self, example: str, second: str | None = None) -> str:
        """The answer-format sentence of an instruction, built from the configured parser."""
        text = f"Reply with your action inside the tags, for example {self.parser.wrap(example)}."
        k = self.config.max_actions_per_turn
        if self.multi_action and k > 1 and second:
            sep = self.config.action_separator.strip() or self.config.action_separator
            text += (
                f" You may give up to {k} actions in one turn, separated by '{sep}', "
                f"for example {self.parser.wrap(self.join_actions([example, second]))}."
            )
        return text

    def _format_feedback(self, parsed: ParsedAction) -> str:
        words = (
            f" Valid actions: {', '.join(self.action_words)}."
            if self.action_words
            else ""
        )
        return f"Invalid action: {parsed.error}.{words}"


def env_is_async(env: Any) -> bool:
    """True when the env's ``step`` is ``async def`` and must be awaited rather than run in a thread."""
    return inspect.iscoroutinefunction(getattr(env, "step", None))
