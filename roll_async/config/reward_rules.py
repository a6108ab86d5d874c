"""The rules of ``custom_envs.<Tag>.reward``: which model scores an episode (or each turn) and how its score enters the reward.

A reward from a model fails in ways an env reward never does (a missing
checkpoint, a template without the response, a judge that never answers), so
every key is checked before any engine starts and each error names the key and
the fix.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from roll_async.config.field_checks import check_fields
from roll_async.errors import ConfigError

#: judge: an LLM served by its own vLLM engine reads a rubric and writes a score; reward_model: a
#: sequence-classification model scores the text directly.
RewardKind = Literal["judge", "reward_model"]
#: add: env reward + weight * score; replace: weight * score (the env reward is kept in metrics only).
RewardMode = Literal["add", "replace"]

#: model_path value meaning the offline tiny model (judge: the tiny policy; reward_model: the tiny reward model).
TINY_MODEL = "tiny"

#: Fields a prompt_template may use (filled from the episode or, per_turn, from the turn; see rewards.episode_text).
TEMPLATE_FIELDS = ("question", "response", "reference", "conversation")
#: Fields a prompt_template must use.
REQUIRED_TEMPLATE_FIELDS = ("response",)

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading an assistant's answer.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer (may be empty):\n{reference}\n\n"
    "Assistant's answer:\n{response}\n\n"
    "Rate the answer's correctness and quality from 0 to 10. "
    "End your reply with a line 'Score: <number>'."
)
DEFAULT_REWARD_MODEL_TEMPLATE = "{question}\n{response}"

#: Tokens a judge keeps free below max_model_len after fitting a prompt (chat-template closers, rounding).
PROMPT_MARGIN_TOKENS = 8

#: Default judge score patterns (the last match in the reply wins): ``Score: 7``, ``\\boxed{7}``.
DEFAULT_SCORE_PATTERN = r"(?:score\s*[:=]\s*\**\s*|\\boxed\{\s*)([-+]?\d+(?:\.\d+)?)"


class RewardRules:
    """The methods of ``RewardConfig`` (roll_async.config.sections): its template, its score pattern, its checks.

    A mixin, so the dataclass keeps its keys with the other sections (the reference page is generated
    from there) while its rules live here; ``engine_keys`` is the set of EngineConfig keys the
    dataclass gives it (this module cannot import the sections, which import it).
    """

    engine_keys: ClassVar[frozenset[str]] = frozenset()

    if TYPE_CHECKING:
        # The dataclass's keys these rules read, for the type checker only (the fields live on RewardConfig).
        kind: str
        model_path: str | None
        prompt_template: str | None
        mode: str
        weight: float
        max_tokens: int
        score_pattern: str | None
        score_min: float
        score_max: float
        max_model_len: int
        engine: dict[str, Any]

    # -- derived -----------------------------------------------------------------------

    def template(self) -> str:
        """The prompt template in force (the kind's default when none is set)."""
        if self.prompt_template is not None:
            return self.prompt_template
        return (
            DEFAULT_JUDGE_TEMPLATE
            if self.kind == "judge"
            else DEFAULT_REWARD_MODEL_TEMPLATE
        )

    def pattern(self) -> re.Pattern[str]:
        """The compiled judge score pattern (case-insensitive)."""
        return re.compile(self.score_pattern or DEFAULT_SCORE_PATTERN, re.IGNORECASE)

    # -- validation --------------------------------------------------------------------

    def validate(self, tag: str) -> None:
        """Raise ConfigError naming ``custom_envs.<tag>.reward.<key>`` and the fix for the first mistake found."""

        def key(name: str) -> str:
            return f"custom_envs.{tag}.reward.{name}"

        kinds = get_args(RewardKind)
        if self.kind not in kinds:
            raise ConfigError(
                f"{key('kind')}={self.kind!r} is not a reward kind; use one of {', '.join(kinds)}"
            )
        modes = get_args(RewardMode)
        if self.mode not in modes:
            raise ConfigError(
                f"{key('mode')}={self.mode!r} is not a reward mode; use add (env reward + weight * score) "
                "or replace (weight * score)"
            )
        self._validate_numbers(key)
        self._validate_template(key)
        if self.kind == "judge":
            self._validate_judge(key)
        self._validate_model_path(key)

    def _validate_numbers(self, key: Callable[[str], str]) -> None:
        # The limits of single keys are declared beside the fields (sections.RewardConfig) and checked by the
        # one pass of validate_config; validate() also runs on its own, so it runs that pass on its section.
        check_fields(type(self), self, key(""))
        if not math.isfinite(self.weight):
            raise ConfigError(f"{key('weight')}={self.weight} must be a finite number")

    def _validate_template(self, key: Callable[[str], str]) -> None:
        template = self.template()
        try:
            used = {
                name.split(".")[0].split("[")[0]
                for _, name, _, _ in string.Formatter().parse(template)
                if name is not None
            }
        except ValueError as exc:
            raise ConfigError(
                f"{key('prompt_template')} cannot be parsed ({exc}); write literal braces as {{{{ and }}}}"
            ) from None
        unknown = sorted(used - set(TEMPLATE_FIELDS))
        if unknown:
            raise ConfigError(
                f"{key('prompt_template')} uses unknown field(s) {{{'}, {'.join(unknown)}}}; it may use "
                f"{{{'}, {'.join(TEMPLATE_FIELDS)}}} (write literal braces as {{{{ and }}}})"
            )
        missing = [name for name in REQUIRED_TEMPLATE_FIELDS if name not in used]
        if missing:
            raise ConfigError(
                f"{key('prompt_template')} lacks {{{'}, {'.join(missing)}}}: the model would never see the episode; "
                "add it where the answer to score goes"
            )

    def _validate_judge(self, key: Callable[[str], str]) -> None:
        try:
            pattern = self.pattern()
        except re.error as exc:
            raise ConfigError(
                f"{key('score_pattern')}={self.score_pattern!r} is not a regex ({exc})"
            ) from None
        if pattern.groups < 1:
            raise ConfigError(
                f"{key('score_pattern')}={self.score_pattern!r} needs a capture group around the number, "
                r"e.g. 'Score: ([0-9.]+)'"
            )
        if not self.score_max > self.score_min:
            raise ConfigError(
                f"{key('score_max')}={self.score_max} must be greater than {key('score_min')}={self.score_min}"
            )
        if self.max_tokens >= self.max_model_len - PROMPT_MARGIN_TOKENS:
            # The prompt budget is max_model_len - max_tokens - margin: with none left every call would fail.
            raise ConfigError(
                f"{key('max_tokens')}={self.max_tokens} leaves no room for the prompt in "
                f"{key('max_model_len')}={self.max_model_len} ({PROMPT_MARGIN_TOKENS} tokens are kept as margin); "
                f"set max_tokens below {self.max_model_len - PROMPT_MARGIN_TOKENS} or raise max_model_len"
            )
        known = self.engine_keys
        unknown = sorted(set(self.engine) - known)
        if unknown:
            raise ConfigError(
                f"{key('engine')} has unknown key(s) {', '.join(unknown)}; it takes engine.* keys "
                f"({', '.join(sorted(known))})"
            )

    def _validate_model_path(self, key: Callable[[str], str]) -> None:
        if not self.model_path:
            raise ConfigError(
                f"{key('model_path')} is not set; give a local HF model directory of the "
                f"{'judge' if self.kind == 'judge' else 'reward model'}, or {TINY_MODEL} for the offline tiny one"
            )
        if self.model_path == TINY_MODEL:
            return
        path = Path(self.model_path).expanduser()
        config_file = path / "config.json"
        if not config_file.is_file():
            what = "does not exist" if not path.exists() else "has no config.json"
            raise ConfigError(
                f"{key('model_path')}={self.model_path!r} {what}; point it at a local HF model directory "
                f"(save_pretrained output; nothing is downloaded at run time) or use {TINY_MODEL}"
            )
        if self.kind == "reward_model":
            _check_reward_model_config(config_file, key("model_path"))


def _check_reward_model_config(config_file: Path, key_name: str) -> None:
    """A reward model needs a ``*ForSequenceClassification`` head with one label (the scalar reward)."""
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key_name}: {config_file} cannot be read ({exc})") from None
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(
            f"{key_name}={str(config_file.parent)!r} is not a reward model: its architectures "
            f"{architectures} have no *ForSequenceClassification head; use a sequence-classification "
            "checkpoint (or kind: judge for a generative model)"
        )
    num_labels = (
        len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    )
    if num_labels != 1:
        raise ConfigError(
            f"{key_name}={str(config_file.parent)!r} has num_labels={num_labels}; a reward model outputs one "
            "scalar (num_labels: 1)"
        )
