"""One scoring call to a reward model or judge: bounded, timed out, retried and counted, never raising.

Hundreds of envs finish episodes at once and a model can hang or answer
nonsense; a reward call must neither flood the model nor stall or crash the
episode, so every call goes through one loop that holds a semaphore, times out,
retries, and turns every failure into a counted ``score=None``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from roll_async.config.sections import RewardConfig
from roll_async.rewards.episode_text import EpisodeText

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelScore:
    """The outcome of scoring one episode; ``score`` is None when no usable score came back."""

    score: float | None
    #: Wall time of the whole call: waiting for a slot, every attempt, the backoffs.
    seconds: float
    attempts: int = 1
    timeouts: int = 0
    errors: int = 0
    parse_failed: bool = False
    #: The model's last reply (judge) for logs; "" for a reward model.
    reply: str = ""

    @property
    def failed(self) -> bool:
        return self.score is None


@dataclass
class RewardCounters:
    """Cumulative counters of one client (its calls from one process)."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    timeouts: int = 0
    errors: int = 0
    parse_failures: int = 0
    #: Calls that ended without a score (timeouts/errors past the retries, parse failures).
    failures: int = 0
    seconds_total: float = 0.0
    seconds_max: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, float]:
        out = {name: float(value) for name, value in asdict(self).items()}
        out["seconds_mean"] = self.seconds_total / self.calls if self.calls else 0.0
        return out


class RewardClient(Protocol):
    """What EpisodeRewardScorer needs: LLMJudge and RewardModelClient both are one."""

    @property
    def counters(self) -> RewardCounters: ...

    async def score(self, episode: EpisodeText) -> ModelScore: ...


#: One attempt: given its index, return (score or None when the reply had no score, reply text); raise on error.
Attempt = Callable[[int], Awaitable[tuple[float | None, str]]]


class BoundedModelCaller:
    """Runs attempts under ``max_concurrency``, ``timeout_s`` and ``max_retries`` of a RewardConfig."""

    def __init__(
        self,
        config: RewardConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.counters = RewardCounters()
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._sleep = sleep
        self._clock = clock

    async def call(self, attempt: Attempt) -> ModelScore:
        """Attempt until a reply comes back (scored or not) or the retries run out; never raises but CancelledError.

        A timed-out attempt is cancelled and must return promptly when cancelled (clean-up such as an engine
        abort runs beside the retries, not in the attempt), so a call ends within about
        ``timeout_s * (max_retries + 1)`` plus the backoffs and the wait for a slot.
        """
        cfg, counters = self.config, self.counters
        started = self._clock()
        counters.calls += 1
        timeouts = errors = 0
        score: float | None = None
        reply = ""
        parse_failed = False
        attempts = 0
        for index in range(cfg.max_retries + 1):
            if index > 0:
                counters.retries += 1
                await self._sleep(cfg.retry_backoff_s * 2 ** (index - 1))
            attempts += 1
            counters.attempts += 1
            async with self._semaphore:
                counters.in_flight += 1
                counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
                try:
                    score, reply = await asyncio.wait_for(
                        attempt(index), timeout=cfg.timeout_s
                    )
                except TimeoutError:
                    timeouts += 1
                    counters.timeouts += 1
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # an engine or actor fault: counted, retried
                    errors += 1
                    counters.errors += 1
                    logger.warning(
                        "reward %s call attempt %d failed: %s: %s",
                        cfg.kind,
                        index + 1,
                        type(exc).__name__,
                        exc,
                    )
                    continue
                finally:
                    counters.in_flight -= 1
            parse_failed = score is None
            counters.parse_failures += int(parse_failed)
            break
        if score is None:
            counters.failures += 1
        seconds = self._clock() - started
        counters.seconds_total += seconds
        counters.seconds_max = max(counters.seconds_max, seconds)
        return ModelScore(
            score=score,
            seconds=seconds,
            attempts=attempts,
            timeouts=timeouts,
            errors=errors,
            parse_failed=parse_failed,
            reply=reply,
        )
