"""GEM envs for the gem adapter's tests, registered with ``gem.register`` as a GEM user would."""

from __future__ import annotations

from typing import Any

from gem.core import Env
from gem.envs.registration import ENV_REGISTRY, register


class NeedsDataEnv(Env):
    """Fails in ``reset`` the way an env fails without its NLTK data (a multi-line LookupError)."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        raise LookupError(
            "\n*****\n  Resource 'words' not found.\n  Please use the NLTK Downloader.\n*****\n"
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise AssertionError("never reached")


class OneQuestionEnv(Env):
    """A one-turn task that reports ``correct`` as GEM's math and QA envs do (reward 0.5 when correct)."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "What is 2 + 2? Answer in \\boxed{}.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        correct = "\\boxed{4}" in action
        return (
            "<｜TERMINAL_STATE｜>",
            0.5 if correct else 0.0,
            True,
            True,
            {"correct": correct},
        )


for env_id, cls in (
    ("test:NeedsData-v0", NeedsDataEnv),
    ("test:OneQuestion-v0", OneQuestionEnv),
):
    if env_id not in ENV_REGISTRY:
        register(env_id, f"{__name__}:{cls.__name__}")
