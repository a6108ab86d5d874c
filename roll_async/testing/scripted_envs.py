"""Scripted envs for rollout-core tests: fixed observations, latency, and failures or hangs on a budget."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FailurePlan:
    """Shared, thread-safe failure budget for in-process tests: the first N resets/steps (over all envs) fail."""

    reset_failures: int = 0
    step_failures: int = 0
    step_hangs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, kind: str) -> bool:
        with self._lock:
            left = getattr(self, kind)
            if left > 0:
                setattr(self, kind, left - 1)
                return True
            return False


class ScriptedEnv:
    """A deterministic text env: terminates after ``episode_length`` steps.

    Reward per step: ``reward`` (a number) or, with ``reward="seed_parity"``,
    1.0 on odd seeds and 0.0 on even ones; ``reward="random"`` draws 0 or 1 per
    episode. ``step_latency_s`` makes steps slow (blocking sleep: a sync env runs
    in the thread pool). Failures: ``fail_rate`` (random per reset/step),
    ``fail_on_seed_mod`` (reset raises when ``seed % fail_on_seed_mod == 0``),
    ``hang_s`` with ``hang_on_step`` (step ``hang_on_step`` sleeps ``hang_s``),
    or a shared ``FailurePlan`` (in-process tests only).
    """

    def __init__(
        self,
        episode_length: int = 3,
        step_latency_s: float = 0.0,
        reset_latency_s: float = 0.0,
        reward: float | str = 1.0,
        fail_rate: float = 0.0,
        fail_on_seed_mod: int = 0,
        hang_on_step: int | None = None,
        hang_s: float = 0.0,
        failure_plan: FailurePlan | None = None,
        observation_words: int = 2,
    ) -> None:
        self.episode_length = episode_length
        self.step_latency_s = step_latency_s
        self.reset_latency_s = reset_latency_s
        self.reward = reward
        self.fail_rate = fail_rate
        self.fail_on_seed_mod = fail_on_seed_mod
        self.hang_on_step = hang_on_step
        self.hang_s = hang_s
        self.failure_plan = failure_plan
        self.observation_words = observation_words
        self.actions: list[str] = []
        self.seeds: list[int] = []
        self.closed = False
        self._t = 0
        self._seed = 0
        self._episode_reward = 0.0
        self._random = random.Random()

    def _observation(self) -> str:
        return " ".join([f"s{self._seed % 97}t{self._t}"] * self.observation_words)

    def _maybe_fail(self, what: str, kind: str) -> None:
        if self.failure_plan is not None and self.failure_plan.take(kind):
            raise RuntimeError(f"planned {what} failure")
        if self.fail_rate and self._random.random() < self.fail_rate:
            raise RuntimeError(f"random {what} failure")

    def _hang_now(self) -> bool:
        planned = self.failure_plan is not None and self.failure_plan.take("step_hangs")
        return planned or (
            self.hang_on_step is not None and self._t == self.hang_on_step
        )

    def _reset_now(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._seed, self._t = int(seed), 0
        self.seeds.append(self._seed)
        if self.fail_on_seed_mod and self._seed % self.fail_on_seed_mod == 0:
            raise RuntimeError(f"reset fails on seed {seed}")
        self._maybe_fail("reset", "reset_failures")
        if self.reward == "random":
            self._episode_reward = float(self._random.random() < 0.5)
        return self._observation(), {"instruction": "Count up."}

    def _step_reward(self) -> float:
        if self.reward == "seed_parity":
            return float(self._seed % 2)
        if self.reward == "random":
            return self._episode_reward
        return float(self.reward)

    def _step_now(
        self, action_text: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._maybe_fail("step", "step_failures")
        self.actions.append(action_text)
        self._t += 1
        terminated = self._t >= self.episode_length
        metrics = {"success": terminated, "action_is_valid": True}
        return (
            self._observation(),
            self._step_reward(),
            terminated,
            False,
            {"metrics": metrics},
        )

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        time.sleep(self.reset_latency_s)
        return self._reset_now(seed)

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep((self.hang_s if self._hang_now() else 0.0) + self.step_latency_s)
        return self._step_now(action_text)

    def close(self) -> None:
        self.closed = True


class AsyncScriptedEnv(ScriptedEnv):
    """ScriptedEnv with ``async def`` reset/step (latency via asyncio.sleep)."""

    # The async form of the env contract (env managers await either form): hence the ignores below.
    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:  # type: ignore[override]
        await asyncio.sleep(self.reset_latency_s)
        return self._reset_now(seed)

    async def step(  # type: ignore[override]
        self, action_text: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(
            (self.hang_s if self._hang_now() else 0.0) + self.step_latency_s
        )
        return self._step_now(action_text)


def scripted_env_factory(tag: str, env_config: dict[str, Any]) -> ScriptedEnv:
    """EnvFactory for tests: ``env_config["async"]`` picks AsyncScriptedEnv; the rest are ScriptedEnv kwargs."""
    config = dict(env_config)
    cls = AsyncScriptedEnv if config.pop("async", False) else ScriptedEnv
    return cls(**config)
