"""An LLM judge: a separate model, on its own vLLM engine, reads a rubric about an episode and writes a score.

The judge must never be the policy (it would grade itself, and move with every
weight sync), so it gets its own engine replicas under the name prefix
``judge``; it is reached through the same EngineClient as the policy engine, so
requests, aborts and transports work the same. A reply without a score is
counted and scored None (zero model reward), never raised.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import uuid
from collections.abc import Sequence
from typing import Any

from roll_async.config.reward_rules import PROMPT_MARGIN_TOKENS, TINY_MODEL
from roll_async.config.sections import EngineConfig, RewardConfig
from roll_async.engine.engine_actor import engine_clients, launch_engines
from roll_async.engine.router import EngineClient
from roll_async.errors import EngineRequestError, InvalidInputError
from roll_async.model import build_tiny_model
from roll_async.prompts.tokenizers import ChatTokenizer, load_tokenizer
from roll_async.rewards.episode_text import EpisodeText
from roll_async.rewards.model_call import BoundedModelCaller, ModelScore, RewardCounters
from roll_async.trajectory import GenerationRequest

logger = logging.getLogger(__name__)

#: Seconds an abort of a timed-out or cancelled judge request may take; it runs beside the retries, never
#: in their way (a hung replica's abort can hang too).
JUDGE_ABORT_TIMEOUT_S = 5.0

#: Aborts in flight (a task nobody awaits needs a reference until it ends).
_pending_aborts: set[asyncio.Task[None]] = set()


def parse_judge_score(
    reply: str, pattern: re.Pattern[str], score_min: float, score_max: float
) -> float | None:
    """The last score ``pattern`` finds in ``reply``, mapped from [score_min, score_max] to [0, 1].

    None when there is no match, the number is not finite, or it lies outside the range.
    """
    matches = pattern.findall(reply)
    if not matches:
        return None
    last = matches[-1]
    text = last[0] if isinstance(last, tuple) else last
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or not score_min <= value <= score_max:
        return None
    return (value - score_min) / (score_max - score_min)


def judge_model_path(config: RewardConfig) -> str:
    """The judge's model directory (``tiny``: the offline tiny model, built if missing)."""
    if config.model_path == TINY_MODEL:
        return str(build_tiny_model())
    return str(config.model_path)


def judge_engine_config(config: RewardConfig) -> EngineConfig:
    """The judge engine's EngineConfig: the reward's replicas and max_model_len, then its ``engine`` keys."""
    settings: dict[str, Any] = {
        "num_replicas": config.num_replicas,
        "max_model_len": config.max_model_len,
    }
    settings.update(dict(config.engine))
    return EngineConfig(**settings)


async def launch_judge_engines(
    config: RewardConfig, *, name_prefix: str = "judge"
) -> list[Any]:
    """Start the judge's own engine replicas (Ray actors ``<name_prefix>_<i>``); shut down with
    ``roll_async.engine.engine_actor.shutdown_engines``. Never weight-synced: keep them out of the policy fleet."""
    return await launch_engines(
        judge_model_path(config), judge_engine_config(config), name_prefix=name_prefix
    )


class LLMJudge:
    """Scores an EpisodeText with a judge model behind one or more EngineClients (a RewardClient)."""

    def __init__(
        self,
        config: RewardConfig,
        clients: Sequence[EngineClient],
        tokenizer: ChatTokenizer,
        *,
        caller: BoundedModelCaller | None = None,
    ) -> None:
        if not clients:
            raise InvalidInputError("LLMJudge needs at least one engine client")
        self.config = config
        self.clients = list(clients)
        self.tokenizer = tokenizer
        self.caller = caller or BoundedModelCaller(config)
        self._pattern = config.pattern()
        self._template = config.template()
        self._in_flight = [0] * len(self.clients)

    @classmethod
    def from_handles(
        cls,
        config: RewardConfig,
        handles: Sequence[Any],
        *,
        request_transport: str = "ray",
    ) -> LLMJudge:
        """A judge over engine actor handles (from ``launch_judge_engines``), with the judge's own tokenizer."""
        tokenizer = load_tokenizer(
            judge_model_path(config), trust_remote_code=config.trust_remote_code
        )
        return cls(config, engine_clients(list(handles), request_transport), tokenizer)

    @property
    def counters(self) -> RewardCounters:
        return self.caller.counters

    # -- prompt ------------------------------------------------------------------------

    def _render(self, episode: EpisodeText) -> list[int]:
        user_text = self._template.format(**episode.fields())
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}],
            add_generation_prompt=True,
            tokenize=False,
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, episode: EpisodeText) -> list[int]:
        """The judge prompt's token ids; a response too long for max_model_len keeps its end."""
        budget = (
            self.config.max_model_len - self.config.max_tokens - PROMPT_MARGIN_TOKENS
        )
        ids = self._render(episode)
        overflow = len(ids) - budget
        if overflow <= 0:
            return ids
        drop = overflow + PROMPT_MARGIN_TOKENS
        ids = self._render(
            EpisodeText(
                question=episode.question,
                response=self._tail(episode.response, drop),
                reference=episode.reference,
                conversation=self._tail(episode.conversation, drop),
            )
        )
        return ids[-budget:] if len(ids) > budget else ids

    def _tail(self, text: str, drop_tokens: int) -> str:
        """``text`` without its first ``drop_tokens`` tokens."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return (
            self.tokenizer.decode(ids[drop_tokens:]) if drop_tokens < len(ids) else ""
        )

    def parse(self, reply: str) -> float | None:
        """The reply's score in [0, 1], or None (see parse_judge_score)."""
        return parse_judge_score(
            reply, self._pattern, self.config.score_min, self.config.score_max
        )

    # -- scoring -----------------------------------------------------------------------

    async def score(self, episode: EpisodeText) -> ModelScore:
        """Score one episode; timeouts, engine errors and unparsable replies come back as ``score=None``."""
        prompt_ids = self.prompt_ids(episode)
        base_id = f"judge-{uuid.uuid4().hex[:16]}"

        async def attempt(index: int) -> tuple[float | None, str]:
            replica = min(range(len(self.clients)), key=lambda i: self._in_flight[i])
            request = GenerationRequest(
                request_id=f"{base_id}-a{index}",
                prompt_token_ids=prompt_ids,
                max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
                logprobs=False,
            )
            self._in_flight[replica] += 1
            try:
                result = await self.clients[replica].generate(request)
            except asyncio.CancelledError:
                # Timed out, or the episode was cancelled (group complete, sync pause, shutdown): free the judge,
                # without waiting on it (a hung replica's abort would hold the timeout and the retries).
                abort_in_background(self.clients[replica], request.request_id)
                raise
            finally:
                self._in_flight[replica] -= 1
            if result.finish_reason in ("abort", "error"):
                raise EngineRequestError(
                    f"judge request {request.request_id} ended {result.finish_reason}"
                )
            reply = self.tokenizer.decode(
                result.output_token_ids, skip_special_tokens=True
            )
            return self.parse(reply), reply

        # A timed-out attempt is cancelled by the caller's wait_for, and a cancelled one aborts its request.
        return await self.caller.call(attempt)


def abort_in_background(client: EngineClient, request_id: str) -> None:
    """Start the abort of one judge request and return at once; it is cut off after JUDGE_ABORT_TIMEOUT_S."""
    task = asyncio.get_running_loop().create_task(
        _abort_quietly(client, request_id, JUDGE_ABORT_TIMEOUT_S)
    )
    _pending_aborts.add(task)
    task.add_done_callback(_pending_aborts.discard)


async def _abort_quietly(
    client: EngineClient, request_id: str, timeout_s: float
) -> None:
    """Abort one judge request within ``timeout_s``; a failure or overrun is logged, never raised."""
    try:
        async with asyncio.timeout(timeout_s):
            await client.abort([request_id])
    except TimeoutError:
        logger.warning(
            "judge abort of %s did not answer within %gs; the replica may be hung",
            request_id,
            timeout_s,
        )
    except Exception as exc:
        logger.debug("judge abort of %s failed: %s", request_id, exc)
