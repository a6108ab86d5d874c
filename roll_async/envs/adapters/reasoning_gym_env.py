"""``reasoning_gym:<task>``: one reasoning-gym procedural task per episode, graded by the task's own scorer.

reasoning-gym offers many procedurally generated tasks with exact graders; the
adapter exposes any of them as a seeded, multi-turn text env without porting.
"""

from __future__ import annotations

from typing import Any

from roll_async.envs.adapters import import_optional, unknown_name_error
from roll_async.envs.parsing import ActionParser
from roll_async.errors import ConfigError, LifecycleError


class ReasoningGymEnv:
    """A reasoning-gym task.

    ``reset(seed)`` draws the task's item for that seed
    (``reasoning_gym.create_dataset(task, seed=seed, size=1, **env_config)``, so a
    seed reproduces the question exactly and every task option of reasoning-gym
    works as documented there). The reply's answer is taken from
    ``<answer>...</answer>`` (``action_pattern``) by the shared
    :class:`~roll_async.envs.parsing.ActionParser` and graded by the dataset's
    ``score_answer`` (a score in [0, 1]; a reply with no answer scores 0).

    With ``max_attempts: N`` (default 1) a wrong answer earns a retry turn: the
    observation says the answer was wrong and asks again, up to N answers in all.
    The reward of a turn is its score when the episode ends there, else 0, so the
    episode reward is the score of the last answer. Metrics: ``score``,
    ``success`` (score == 1), ``attempts``, ``action_is_valid`` (an answer was found).
    """

    def __init__(
        self,
        task: str,
        *,
        max_attempts: int = 1,
        action_pattern: str = r"<answer>(.*?)</answer>",
        **dataset_kwargs: Any,
    ) -> None:
        env_type = f"reasoning_gym:{task}"
        rg = import_optional("reasoning_gym", "reasoning-gym", env_type)
        from reasoning_gym.factory import DATASETS

        if task not in DATASETS:
            raise unknown_name_error("reasoning-gym task", env_type, task, DATASETS)
        if int(max_attempts) < 1:
            raise ConfigError(
                f"env_type {env_type!r}: max_attempts must be >= 1, got {max_attempts}"
            )
        self._rg = rg
        self.task = task
        self.max_attempts = int(max_attempts)
        self.dataset_kwargs = dict(dataset_kwargs)
        self.parser = ActionParser(pattern=action_pattern, separator="", max_actions=1)
        try:  # build once so a bad option fails at preflight, not in the first episode
            rg.create_dataset(task, seed=0, size=1, **self.dataset_kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ConfigError(
                f"env_type {env_type!r}: env_config {self.dataset_kwargs} rejected: {exc}"
            ) from None
        self._dataset: Any = None
        self._entry: dict[str, Any] | None = None
        self.attempts = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._dataset = self._rg.create_dataset(
            self.task, seed=int(seed), size=1, **self.dataset_kwargs
        )
        self._entry = self._dataset[0]
        self.attempts = 0
        instruction = (
            f"{self._entry['question']}\n"
            f"Give your final answer inside the tags, for example {self.parser.wrap('your answer')}."
        )
        return "", {"instruction": instruction, "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._entry is None:
            raise LifecycleError(
                f"reasoning_gym:{self.task}: step() before reset() or after the episode ended"
            )
        parsed = self.parser.parse(action_text)
        answer = parsed.actions[0] if parsed.is_valid else None
        score = (
            float(self._dataset.score_answer(answer, self._entry) or 0.0)
            if answer is not None
            else 0.0
        )
        self.attempts += 1
        solved = score >= 1.0
        done = solved or self.attempts >= self.max_attempts
        metrics = {
            "score": score,
            "success": solved,
            "attempts": float(self.attempts),
            "action_is_valid": parsed.is_valid,
        }
        if done:
            self._entry = None
            return (
                ("Correct." if solved else "Wrong answer."),
                score,
                True,
                False,
                {"metrics": metrics},
            )
        left = self.max_attempts - self.attempts
        why = (
            "No answer found in your reply."
            if answer is None
            else f"Your answer {answer!r} is wrong."
        )
        text = f"{why} Try again ({left} attempt{'s' if left > 1 else ''} left); give the answer as {self.parser.wrap('...')}."
        return text, 0.0, False, False, {"metrics": metrics}

    def close(self) -> None:
        """Nothing to free."""
