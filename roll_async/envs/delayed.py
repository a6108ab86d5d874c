"""DelayedEnv: an env with added reset/step latency, to model slow simulators and tools.

Real agent envs (web pages, code sandboxes, game engines) take from milliseconds
to seconds per step, with a long tail; this wrapper lets tests and benchmarks
reproduce that with the built-in envs, with a fixed latency or a lognormal one
seeded by the episode seed so runs are repeatable. As ``env_type: delayed`` its
``env_config`` names the wrapped env in ``inner_env_type`` / ``inner_env_config``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll_async.envs.wrapper import EnvWrapper
from roll_async.errors import ConfigError


@dataclass
class DelayedEnvConfig:
    #: The wrapped env, built by the registry when the wrapper is made by name.
    inner_env_type: str = "sokoban"
    inner_env_config: dict[str, Any] = field(default_factory=dict)
    step_latency_s: float = 0.0
    reset_latency_s: float = 0.0
    #: Lognormal sigma of the step latency (median stays step_latency_s); 0 means fixed.
    step_latency_sigma: float = 0.0
    #: Upper bound of one step's latency, so a draw from the tail cannot stall a test.
    max_step_latency_s: float = 30.0

    def __post_init__(self) -> None:
        for name in (
            "step_latency_s",
            "reset_latency_s",
            "step_latency_sigma",
            "max_step_latency_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"delayed env: {name}={getattr(self, name)} must be >= 0"
                )


class DelayedEnv(EnvWrapper):
    """Sleeps (blocking, like a real simulator would compute) before delegating to the inner env."""

    config_cls = DelayedEnvConfig
    config: DelayedEnvConfig

    def __init__(self, env: Any, config: DelayedEnvConfig | None = None) -> None:
        super().__init__(env, config or DelayedEnvConfig())
        self._rng = np.random.default_rng(0)

    def _step_delay(self) -> float:
        median, sigma = self.config.step_latency_s, self.config.step_latency_sigma
        if median <= 0:
            return 0.0
        if sigma <= 0:
            return median
        return min(
            self.config.max_step_latency_s,
            float(median * math.exp(sigma * self._rng.standard_normal())),
        )

    def reset(self, seed: int) -> tuple[Any, dict[str, Any]]:
        self._rng = np.random.default_rng(seed)
        if self.config.reset_latency_s > 0:
            time.sleep(self.config.reset_latency_s)
        answer: tuple[Any, dict[str, Any]] = self.inner.reset(seed=seed)
        return answer

    def step(self, action_text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        delay = self._step_delay()
        if delay > 0:
            time.sleep(delay)
        result: tuple[Any, float, bool, bool, dict[str, Any]] = self.inner.step(
            action_text
        )
        return result
