"""LongTailEnv: a benchmark workload with long-tailed episode lengths and step latencies.

Agentic rollouts are dominated by their tails: most episodes take a couple of
turns, a few take many; most tool calls return in a fraction of a second, a
few take seconds. This env reproduces that shape with no task logic, so
throughput benchmarks measure scheduling, not an env's quirks.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from roll_async.errors import ConfigError, LifecycleError

#: Words observations are made of (tool-output-like, and known to the tiny model's tokenizer).
_WORDS = (
    "result found page search query answer the a of item box goal step tool returned value row column "
    "file line error ok status done next left right up down target player wall river city year name"
).split()


@dataclass
class LongTailEnvConfig:
    #: Fewest turns an episode has (the Pareto scale).
    min_turns: int = 1
    #: Most turns an episode has (the Pareto draw is capped here).
    max_turns: int = 12
    #: Pareto tail index of the turn count; smaller is heavier. 0: always min_turns.
    turns_alpha: float = 1.2
    #: Median seconds per step (0: no latency).
    step_latency_s: float = 0.0
    #: Lognormal sigma of the step latency (0: fixed at step_latency_s).
    step_latency_sigma: float = 0.0
    #: Cap on the lognormal part of one step's latency.
    max_step_latency_s: float = 10.0
    #: Probability that a step is "very slow": it takes slow_step_s more.
    slow_step_prob: float = 0.0
    slow_step_s: float = 0.0
    reset_latency_s: float = 0.0
    #: Median words per observation, and the lognormal sigma of that size (0: fixed).
    observation_words: int = 12
    observation_words_sigma: float = 0.5
    #: Draws depend on the actions too (group members differ); false: on the seed only.
    vary_within_group: bool = True

    def __post_init__(self) -> None:
        if int(self.min_turns) < 1 or int(self.max_turns) < int(self.min_turns):
            raise ConfigError(
                f"longtail env: need 1 <= min_turns <= max_turns, got min_turns={self.min_turns}, max_turns={self.max_turns}"
            )
        for name in (
            "turns_alpha",
            "step_latency_s",
            "step_latency_sigma",
            "max_step_latency_s",
            "slow_step_s",
            "reset_latency_s",
            "observation_words_sigma",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"longtail env: {name}={getattr(self, name)} must be >= 0"
                )
        if not 0.0 <= self.slow_step_prob <= 1.0:
            raise ConfigError(
                f"longtail env: slow_step_prob={self.slow_step_prob} must be in [0, 1]"
            )
        if int(self.observation_words) < 1:
            raise ConfigError(
                f"longtail env: observation_words={self.observation_words} must be >= 1"
            )
        self.min_turns, self.max_turns, self.observation_words = (
            int(self.min_turns),
            int(self.max_turns),
            int(self.observation_words),
        )


def pareto_turns(u: float, min_turns: int, max_turns: int, alpha: float) -> int:
    """Discrete Pareto draw from a uniform ``u`` in (0, 1]: ``min(max_turns, floor(min_turns * u ** (-1/alpha)))``."""
    if alpha <= 0 or min_turns == max_turns:
        return min_turns
    u = min(1.0, max(u, 1e-12))
    return int(min(max_turns, math.floor(min_turns * u ** (-1.0 / alpha))))


def _text_key(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "replace"))


class LongTailEnv:
    """Sync API; one instance plays many episodes (``reset`` starts one).

    * **turns**: each episode terminates after ``T`` turns, drawn from a discrete
      Pareto law: ``T = min(max_turns, floor(min_turns * U ** (-1 / turns_alpha)))``
      (``P(T >= k) ~ (min_turns / k) ** turns_alpha``). ``turns_alpha: 0`` gives
      every episode exactly ``min_turns`` turns.
    * **step latency**: lognormal with median ``step_latency_s`` and sigma
      ``step_latency_sigma`` (0: fixed), capped at ``max_step_latency_s``; with
      probability ``slow_step_prob`` a step takes ``slow_step_s`` more (the "few
      very slow steps": a sandbox cold start, a timeout-and-retry). The sleep is
      blocking, as a local simulator computing would be, so it runs in the env
      thread pool like any sync env.
    * **observation size**: ``observation_words`` words (times a lognormal factor
      with sigma ``observation_words_sigma``), like tool outputs of varying size.

    Answer lengths are not the env's to choose: they come from the model and the
    tag's ``max_tokens_per_step`` and ``stop`` strings (see benchmarks/README.md).

    Randomness. Every draw is a function of the episode seed and, when
    ``vary_within_group`` is true (default), of the text of the model's actions:
    the turn count from (seed, first action), each step's latency from (seed,
    turn, action). So a seed reproduces an episode given the same actions, and the
    members of a GRPO group (same seed, different sampled answers) still get
    different lengths and latencies, as real tasks do. With
    ``vary_within_group: false`` everything depends on the seed only.
    """

    config_cls = LongTailEnvConfig

    def __init__(self, config: LongTailEnvConfig | None = None) -> None:
        self.config = config or LongTailEnvConfig()
        self.seed = 0
        self.turn = 0
        self.target_turns: int | None = None
        self.done = True
        self.last_step_latency_s = 0.0

    # -- draws -------------------------------------------------------------------------

    def _rng(self, *keys: int) -> np.random.Generator:
        return np.random.default_rng(
            [self.seed & 0x7FFFFFFF, *[k & 0x7FFFFFFF for k in keys]]
        )

    def _action_key(self, action_text: str) -> int:
        return _text_key(action_text) if self.config.vary_within_group else 0

    def draw_turns(self, action_text: str) -> int:
        c = self.config
        if c.turns_alpha <= 0 or c.min_turns == c.max_turns:
            return c.min_turns  # fixed: no draw (each draw has its own generator, so skipping one changes no other)
        u = 1.0 - self._rng(1, self._action_key(action_text)).random()  # (0, 1]
        return pareto_turns(u, c.min_turns, c.max_turns, c.turns_alpha)

    def draw_step_latency(self, turn: int, action_text: str) -> float:
        c = self.config
        if c.step_latency_s <= 0 and c.slow_step_prob <= 0:
            return 0.0  # no latency to draw
        rng = self._rng(2, turn, self._action_key(action_text))
        z, slow = rng.standard_normal(), rng.random()
        delay = 0.0
        if c.step_latency_s > 0:
            delay = (
                c.step_latency_s * math.exp(c.step_latency_sigma * z)
                if c.step_latency_sigma > 0
                else c.step_latency_s
            )
            delay = min(delay, c.max_step_latency_s)
        if c.slow_step_prob > 0 and slow < c.slow_step_prob:
            delay += c.slow_step_s
        return delay

    def _observation(self, turn: int, action_text: str) -> str:
        c = self.config
        rng = self._rng(3, turn, self._action_key(action_text))
        factor = (
            math.exp(c.observation_words_sigma * rng.standard_normal())
            if c.observation_words_sigma > 0
            else 1.0
        )
        n = max(1, int(round(c.observation_words * factor)))
        words = " ".join(
            [_WORDS[i] for i in rng.integers(0, len(_WORDS), size=n).tolist()]
        )
        return f"Step {turn}: tool returned: {words}"

    # -- gym API -----------------------------------------------------------------------

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.seed, self.turn, self.target_turns, self.done = int(seed), 0, None, False
        if self.config.reset_latency_s > 0:
            time.sleep(self.config.reset_latency_s)
        instruction = "Use the tool until the task is done. Reply with your action inside <answer></answer>."
        return self._observation(0, ""), {"instruction": instruction, "seed": self.seed}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise LifecycleError(
                "LongTailEnv.step() called before reset() or after the episode ended"
            )
        if self.target_turns is None:
            self.target_turns = self.draw_turns(action_text)
        delay = self.draw_step_latency(self.turn, action_text)
        self.last_step_latency_s = delay
        if delay > 0:
            time.sleep(delay)
        self.turn += 1
        terminated = self.turn >= self.target_turns
        self.done = terminated
        reward = 1.0 if terminated else 0.0
        metrics = {
            "action_is_valid": True,
            "success": terminated,
            "target_turns": float(self.target_turns),
            "step_latency_s": delay,
        }
        return (
            self._observation(self.turn, action_text),
            reward,
            terminated,
            False,
            {"metrics": metrics},
        )

    def close(self) -> None:
        self.done = True
