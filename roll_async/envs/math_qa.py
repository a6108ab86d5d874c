"""Math: answer a problem from a user's dataset; the answer is checked symbolically against the reference.

Reasoning RL on math needs the user's own problems and a grader that accepts
every correct form of an answer (``0.5``, ``1/2``, ``\\frac{1}{2}``), so problems
come from a parquet or JSONL file (:mod:`roll_async.envs.math_tasks`; by default
the shipped generated set) and the reply's last ``\\boxed{...}`` or
``<answer>...</answer>`` is judged by math-verify in bounded time
(:mod:`roll_async.envs.math_answers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.envs.math_answers import (
    VerifyOutcome,
    VerifyStatus,
    stated_answers,
    verifier_pool,
    verify_answer,
)
from roll_async.envs.math_tasks import ENV_CONFIG_KEY, MathTask, load_math_tasks
from roll_async.envs.parsing import ParsedAction
from roll_async.errors import ConfigError


@dataclass
class MathQAConfig(EnvConfig):
    #: Turns per episode; None: one per attempt (``max_attempts``).
    max_steps: int | None = None  # type: ignore[assignment]
    #: Answers the model may give; after a wrong one it is told so and may try again.
    max_attempts: int = 1
    #: Parquet or JSONL file, one problem per row; None: the shipped generated problems.
    data_path: str | None = None
    question_key: str = "problem"
    answer_key: str = "answer"
    #: Only rows whose ``split_key`` column equals this (train, val, ...); ``all``: every row.
    split: str = "all"
    split_key: str = "split"
    #: Seed of the one shuffle of the rows that reset seeds index into.
    shuffle_seed: int = 0
    correct_reward: float = 1.0
    wrong_answer_reward: float = 0.0
    #: Seconds one answer's check may take; past it the answer counts as wrong (``verify_timeout``).
    verify_timeout_s: float = 5.0
    #: Helper processes checking answers, shared by every math env of this process.
    verify_workers: int = 2

    def __post_init__(self) -> None:
        self.max_attempts = int(self.max_attempts)
        if self.max_attempts < 1:
            raise ConfigError(
                f"{ENV_CONFIG_KEY}.max_attempts={self.max_attempts}: must be >= 1"
            )
        if self.max_steps is None:
            self.max_steps = self.max_attempts
        super().__post_init__()
        if float(self.verify_timeout_s) <= 0:
            raise ConfigError(
                f"{ENV_CONFIG_KEY}.verify_timeout_s={self.verify_timeout_s}: must be > 0 seconds"
            )
        if int(self.verify_workers) < 1:
            raise ConfigError(
                f"{ENV_CONFIG_KEY}.verify_workers={self.verify_workers}: must be >= 1"
            )
        self.verify_timeout_s, self.verify_workers = (
            float(self.verify_timeout_s),
            int(self.verify_workers),
        )
        self.shuffle_seed = int(self.shuffle_seed)
        self.load_tasks()  # a bad file or column fails here, when the config is built

    def load_tasks(self) -> tuple[MathTask, ...]:
        """The selected problems of the data file (read once per file version, then cached)."""
        return load_math_tasks(
            self.data_path,
            self.question_key,
            self.answer_key,
            self.split,
            self.split_key,
        )


class MathQAEnv(BaseEnv):
    """One problem per episode, graded by math-verify; optional retries after a wrong answer.

    Seed ``s`` takes row ``s mod n`` of the rows shuffled once by ``shuffle_seed``,
    so seeds ``0..n-1`` visit every problem once. Rewards: ``correct_reward`` (1)
    for a correct answer (ends the episode); ``wrong_answer_reward`` (0) for a
    wrong, unreadable (``answer_unparsed``), hedged (``answer_ambiguous``: every
    answer a reply states must be correct, see roll_async.envs.math_answers), not
    final (``answer_not_final``: the question's expression or an unevaluated form
    boxed back, see math_answers.final_form),
    unverifiable (``verify_error``) or timed-out (``verify_timeout``) one, after
    which the model is told and may try again while ``max_attempts`` allow;
    ``format_penalty`` (-0.1) for a turn with no answer. A verifier that cannot
    start or dies raises VerifierUnavailable from ``step``: the episode ends
    ``env_error`` rather than a 0 the policy did not earn.
    """

    config_cls: ClassVar[type] = MathQAConfig
    multi_action: ClassVar[bool] = False

    def __init__(
        self, config: MathQAConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: MathQAConfig
        self.tasks = self.config.load_tasks()
        self.order = np.random.default_rng(self.config.shuffle_seed).permutation(
            len(self.tasks)
        )
        self.task = self.tasks[int(self.order[0])]
        self.attempts = 0
        self.status_text = ""
        self.turn_outcome: VerifyOutcome | None = None
        #: Every answer the reply being graded states (the last is its answer).
        self.answers: list[str] = []

    @property
    def num_tasks(self) -> int:
        """Distinct problems; ``make-env-dataset`` keeps its seeds distinct modulo this."""
        return len(self.tasks)

    @classmethod
    def dataset_env_config(
        cls, env_config: dict[str, Any], split: str
    ) -> dict[str, Any]:
        """``make-env-dataset --split S``: draw the rows' problems from split S when the data file has it."""
        if "split" in env_config:
            return env_config
        try:
            MathQAConfig(**{**env_config, "split": split})
        except ConfigError:
            return env_config
        return {**env_config, "split": split}

    def reset(self, seed: int) -> tuple[Any, dict[str, Any]]:
        """As BaseEnv's, with the problem's reference answer in ``info["reference"]`` (for a judge; never shown to the policy)."""
        observation, info = super().reset(seed)
        info["reference"] = self.task.answer
        return observation, info

    def step(self, action_text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.turn_outcome = None
        return super().step(action_text)

    def _reset(self, seed: int) -> None:
        self.task = self.tasks[int(self.order[seed % len(self.order)])]
        self.attempts = 0
        self.status_text = ""
        self.turn_outcome = None

    def _parse(self, action_text: str) -> ParsedAction:
        self.answers = stated_answers(action_text or "", self.parser.regex)
        if not self.answers:
            return ParsedAction(
                error="no answer found; put the final answer in \\boxed{...}"
            )
        answer = self.answers[-1]
        return ParsedAction(actions=[answer], raw=answer, is_valid=True)

    def _apply(self, action: str) -> tuple[float, bool, str]:
        cfg = self.config
        self.attempts += 1
        outcome = verify_answer(
            self.task.answer,
            self.answers or [action],
            cfg.verify_timeout_s,
            verifier_pool(cfg.verify_workers),
            question=self.task.question,
        )
        self.turn_outcome = outcome
        left = cfg.max_attempts - self.attempts
        if outcome.correct:
            self.success = self.done = True
            self.status_text = "Your answer is correct."
            return cfg.correct_reward, True, ""
        if outcome.status is VerifyStatus.REFERENCE_UNPARSED:
            # Not the model's fault and retrying will not help: end the episode ungraded.
            self.done = True
            self.status_text = "Your answer could not be graded."
            return 0.0, False, ""
        why = {
            VerifyStatus.UNPARSED: "could not be read as a mathematical expression",
            VerifyStatus.AMBIGUOUS: "states more than one value; give one final answer",
            VerifyStatus.NOT_FINAL: "is not in final form; evaluate and simplify it",
            VerifyStatus.TIMEOUT: "could not be checked in time, so it counts as wrong",
            VerifyStatus.ERROR: "could not be verified, so it counts as wrong",
        }.get(outcome.status, "is not correct")
        if left <= 0:
            self.done = True
            self.status_text = f"Your answer {why}."
        else:
            self.status_text = (
                f"Your answer {why}. Try again; attempts left: {left}. "
                "Put the final answer in \\boxed{...}."
            )
        return cfg.wrong_answer_reward, False, ""

    def extra_metrics(self) -> dict[str, float | bool]:
        status = self.turn_outcome.status if self.turn_outcome else None
        return {
            "num_attempts": float(self.attempts),
            "answer_unparsed": status is VerifyStatus.UNPARSED,
            "answer_ambiguous": status is VerifyStatus.AMBIGUOUS,
            "answer_not_final": status is VerifyStatus.NOT_FINAL,
            "verify_timeout": status is VerifyStatus.TIMEOUT,
            "verify_error": status is VerifyStatus.ERROR,
            "reference_unparsed": status is VerifyStatus.REFERENCE_UNPARSED,
        }

    def render_text(self) -> str:
        return self.status_text or f"Problem: {self.task.question}"

    def instruction(self) -> str:
        cfg = self.config
        tries = (
            f" You have {cfg.max_attempts} attempts; after a wrong answer you may try again."
            if cfg.max_attempts > 1
            else ""
        )
        return (
            "Solve the math problem. Think briefly, then give the final answer in \\boxed{...}, "
            "for example \\boxed{\\frac{3}{4}}. Any equivalent form of the answer is accepted.\n"
            f"Rewards: +{cfg.correct_reward:g} for a correct answer, {cfg.wrong_answer_reward:g} for a wrong one."
            + tries
        )

    def solve(self) -> list[str] | None:
        """The reference answer, as the one answer to give."""
        return [self.task.answer]

    def expert_responses(self) -> list[str] | None:
        return [f"The answer is \\boxed{{{self.task.answer}}}."]
