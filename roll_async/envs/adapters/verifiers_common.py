"""What the verifiers adapters share: the extra's name, the API names, a rollout's result and the errors.

Kept apart from the loader (``verifiers_env``) so that the two API adapters (``verifiers_legacy`` for
verifiers < 0.4, ``verifiers_v1`` for 0.4 on) and the loader that picks one import it without a circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from roll_async.errors import ConfigError, RollAsyncError

#: How to install verifiers: the extra holds its dependencies that fit roll-async's pins, and verifiers goes in
#: without its own (0.3.1 pins mcp<2 and 0.4.0 openai<3, below what vLLM and openai-agents need; both run with ours).
VERIFIERS_INSTALL = (
    "pip install 'roll-async[verifiers]' && pip install --no-deps verifiers==0.3.1"
)

#: legacy: verifiers < 0.4 (``vf.load_environment(env_id, **env_args)``); v1: 0.4 on (``verifiers.v1``).
VerifiersApi = Literal["legacy", "v1"]


class VerifiersEpisodeError(RollAsyncError, RuntimeError):
    """A verifiers rollout ended in an error (the env's or the harness's): the episode is an ``env_error``."""


@dataclass
class VerifiersResult:
    """One rollout's outcome: the rubric's reward and each reward function's score (named ``rubric_<fn>``)."""

    reward: float
    metrics: dict[str, float]


def rubric_metrics(scores: Mapping[str, Any]) -> dict[str, float]:
    """``rubric_<fn>`` -> score for each numeric per-function score (the episode metrics)."""
    return {
        f"rubric_{name}": float(value)
        for name, value in scores.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def load_failure(env_id: str, key: str, exc: BaseException) -> ConfigError:
    """The one-line ConfigError for an environment that did not load."""
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())
    return ConfigError(
        f"{key}: verifiers cannot load environment {env_id!r} ({cause}); install the environment's "
        f"package (or fix its module), and verifiers itself with: {VERIFIERS_INSTALL}"
    )
