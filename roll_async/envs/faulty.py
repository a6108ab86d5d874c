"""FaultyEnv: an env that sometimes hangs, crashes or raises, to test fault containment.

Real envs hang (a simulator deadlocks), segfault (a C extension), get OOM-killed
or raise; this wrapper injects those faults so tests, the env server and users
can check that a run survives them. Faults are drawn from the OS's randomness,
not the episode seed, so a group's retries do not fault the same way forever.
As ``env_type: faulty`` its ``env_config`` names the wrapped env in
``inner_env_type`` / ``inner_env_config``. With ``trigger_dir`` set it injects
nothing at random: it is the test hook of the chaos soak (``benchmarks/chaos.py``),
which drops a file ``<name>.<fault>`` there for each fault it schedules; the next
call of any env reading that directory claims it (an atomic rename into
``claimed/``, so exactly one env does, across processes) and injects that fault.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from roll_async.envs.wrapper import EnvWrapper
from roll_async.errors import ConfigError

FAULTS = ("hang", "crash", "segfault", "raise")


@dataclass
class FaultyEnvConfig:
    #: The wrapped env, built by the registry when the wrapper is made by name.
    inner_env_type: str = "countdown"
    inner_env_config: dict[str, Any] = field(default_factory=dict)
    #: hang (sleeps past any timeout) | crash (os._exit(3)) | segfault (SIGSEGV) | raise;
    #: crash and segfault end the process: use them only with isolation: process or an env server.
    fault: str = "hang"
    fault_probability: float = 0.1
    #: reset | step: which call may fault.
    fault_on: str = "step"
    hang_s: float = 3600.0
    #: A directory of fault files (``<name>.<fault>``): when set, only the faults dropped there are injected,
    #: each once, by the env call that claims it (``fault`` and ``fault_probability`` are not used).
    trigger_dir: str | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ConfigError(
                f"faulty env: fault={self.fault!r} is not one of {list(FAULTS)}"
            )
        if self.fault_on not in ("reset", "step"):
            raise ConfigError(
                f"faulty env: fault_on={self.fault_on!r}; use reset or step"
            )
        if not 0.0 <= float(self.fault_probability) <= 1.0:
            raise ConfigError(
                f"faulty env: fault_probability={self.fault_probability} must be within [0, 1]"
            )


class FaultyEnv(EnvWrapper):
    """Delegates to the inner env; ``fault_probability`` of the chosen calls fault instead; crash and segfault end the process."""

    config_cls = FaultyEnvConfig
    config: FaultyEnvConfig

    def __init__(self, env: Any, config: FaultyEnvConfig | None = None) -> None:
        super().__init__(env, config or FaultyEnvConfig())
        self._rng = random.Random(os.urandom(8))

    def _claim_trigger(self) -> str | None:
        """The fault of the first trigger file this env claims, or None when there is none."""
        trigger_dir = self.config.trigger_dir
        assert trigger_dir is not None
        try:
            names = sorted(os.listdir(trigger_dir))
        except FileNotFoundError:
            return None
        for name in names:
            fault = name.rsplit(".", 1)[-1]
            if fault not in FAULTS:
                continue
            claimed = os.path.join(trigger_dir, "claimed", name)
            try:
                os.rename(os.path.join(trigger_dir, name), claimed)
            except FileNotFoundError:  # another env claimed it first
                continue
            with open(claimed, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "at": time.time()}) + "\n")
            return fault
        return None

    def _maybe_fault(self, call: str) -> None:
        cfg = self.config
        if call != cfg.fault_on:
            return
        if cfg.trigger_dir is not None:
            fault = self._claim_trigger()
            if fault is None:
                return
        elif self._rng.random() >= cfg.fault_probability:
            return
        else:
            fault = cfg.fault
        if fault == "hang":
            time.sleep(cfg.hang_s)
        elif fault == "crash":
            os._exit(3)
        elif fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise RuntimeError(f"injected fault in {call}")

    def reset(self, seed: int) -> tuple[Any, dict[str, Any]]:
        self._maybe_fault("reset")
        answer: tuple[Any, dict[str, Any]] = self.inner.reset(seed=seed)
        return answer

    def step(self, action_text: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._maybe_fault("step")
        result: tuple[Any, float, bool, bool, dict[str, Any]] = self.inner.step(
            action_text
        )
        return result
