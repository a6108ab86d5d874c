"""Generating one turn against the engine is where engine faults are absorbed
(retries, continuation after an abort, the weight version of every token), and
both env episodes and agent sessions need exactly that path; so it lives here,
apart from the episode loop, behind one public method.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from roll_async.agent_gateway.chat_request import Sampling
from roll_async.config.schema import GenerationConfig
from roll_async.engine.router import EngineClient
from roll_async.env_managers.env_status import EnvManagerStats, PhaseReporter
from roll_async.errors import EngineRequestError
from roll_async.prompts.images import ObservationEncoder
from roll_async.trajectory import (
    GenerationRequest,
    GenerationResult,
    Trajectory,
    TurnRecord,
)

logger = logging.getLogger(__name__)

#: How long to wait for an engine abort before giving up on it.
_ABORT_TIMEOUT_S = 5.0
#: Longest pause between continuations when the engine keeps aborting without producing tokens.
_MAX_ABORT_BACKOFF_S = 1.0


@dataclass
class TurnGeneration:
    """The engine's output for one turn, however many requests it took."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_versions: list[int]
    resumed: int
    seconds: float
    #: Version that sampled each of ``token_ids``.
    token_versions: list[int] = field(default_factory=list)
    #: Wall clock (unix seconds) when the turn's first request was sent and its last result came back.
    started_at: float = 0.0
    finished_at: float = 0.0

    def turn_record(self, turn: int, action_text: str) -> TurnRecord:
        """This generation as a turn (observation, reward and env time are filled in after the env step)."""
        return TurnRecord(
            turn=turn,
            action_text=action_text,
            observation="",
            reward=0.0,
            generated_tokens=len(self.token_ids),
            weight_version=self.weight_versions[-1] if self.weight_versions else -1,
            generate_s=self.seconds,
            env_step_s=0.0,
            finish_reason=self.finish_reason,
            resumed_generations=self.resumed,
            weight_versions=list(self.weight_versions),
            generate_started_at=self.started_at,
            generate_finished_at=self.finished_at,
        )


def append_generation(
    result: GenerationResult,
    token_ids: list[int],
    logprobs: list[float],
    versions: list[int],
    token_versions: list[int] | None = None,
) -> int:
    """Append one engine result of a turn (ids, logprobs padded with 0.0 where missing, version); returns ids added.

    A turn may take several results when an abort interrupts it; each piece is kept as the engine returned it.
    ``versions`` gets the piece's versions (two when an update in pause mode ``keep`` fell inside it);
    ``token_versions`` one version per token (the piece's ``weight_version`` where the engine gave none).
    """
    new_ids = list(result.output_token_ids)
    new_logprobs = list(result.logprobs)[: len(new_ids)]
    new_logprobs += [0.0] * (len(new_ids) - len(new_logprobs))
    per_token = list(result.token_versions)
    if len(per_token) != len(new_ids):
        per_token = [result.weight_version] * len(new_ids)
    token_ids.extend(new_ids)
    logprobs.extend(new_logprobs)
    for version in per_token or [result.weight_version]:
        if not versions or versions[-1] != version:
            versions.append(version)
    if token_versions is not None:
        token_versions.extend(per_token)
    return len(new_ids)


def stop_string_end(
    decode: Callable[[list[int]], str], token_ids: list[int], stop: list[str]
) -> int | None:
    """The fewest leading ids whose text holds one of ``stop`` (vLLM ends a request at the token that
    completes a stop string and keeps it: ``include_stop_str_in_output``); None if the text holds none.

    Decoding a longer prefix only appends text, so the search halves the ids each time.
    """
    if not stop or not any(s in decode(token_ids) for s in stop):
        return None
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if any(s in decode(token_ids[:middle]) for s in stop):
            high = middle
        else:
            low = middle + 1
    return high


class TurnGenerator:
    """Generates the turns of one env instance's episodes.

    Per turn the engine gets ``max_new_tokens`` and the env's stop strings. A
    request that raises (or exceeds ``generation.request_timeout_s``), or that
    comes back with vLLM's retryable ``error`` finish reason (its partial output
    is discarded, never trained on), is retried ``generation.max_retries`` times
    with exponential backoff; then :class:`EngineRequestError` names env, turn and
    request. A request that comes back with finish reason ``abort`` (engine
    paused for a weight update, or aborted) is NOT thrown away: the turn
    continues from the partial output (prompt + partial ids, fewer max_tokens),
    with the behaviour logprobs of every piece kept and the weight versions of
    all pieces recorded (``TurnRecord.resumed_generations`` counts it). The
    engine checks stop strings only in a continuation's own output, so a stop
    string split across an abort is checked on the joined output (``decode``):
    the turn then ends at the token that completes it, as vLLM would have ended
    it, with finish reason ``stop`` and the ids, logprobs and token versions
    after it dropped. Every generated token keeps the weight version that
    sampled it. A cancelled turn aborts its in-flight request.
    """

    def __init__(
        self,
        env_id: int,
        engine: EngineClient,
        *,
        generation: GenerationConfig,
        stop: list[str],
        observations: ObservationEncoder,
        stats: EnvManagerStats,
        phases: PhaseReporter,
        greedy: bool = False,
        abort_backoff_s: float = 0.02,
        request_prefix: str = "",
        clock: Callable[[], float] = time.monotonic,
        decode: Callable[[list[int]], str] | None = None,
        adapter_lag: int = 0,
    ) -> None:
        self.env_id = env_id
        self.engine = engine
        self.generation = generation
        #: The env's stop strings, used unless a call brings its own sampling.
        self.stop = list(stop)
        self.observations = observations
        self.stats = stats
        self.phases = phases
        #: Validation: temperature 0.
        self.greedy = greedy
        #: First pause when the engine answers 'abort' without any new token (it is paused); doubles up to 1 s.
        self.abort_backoff_s = abort_backoff_s
        #: Makes request ids unique across schedulers sharing an engine (train and val, restarts).
        self.request_prefix = request_prefix
        self._clock = clock
        #: Generated ids -> text as the engine's detokenizer sees it (special tokens skipped); finds a stop
        #: string split across an abort. None: only the engine checks stop strings.
        self.decode = decode
        self._request_counter = itertools.count()
        #: A ``snapshot:<k>`` game seat of a LoRA run: its requests run on the adapter k versions back (GenerationRequest).
        self.adapter_lag = adapter_lag

    async def generate(
        self,
        trajectory: Trajectory,
        turn: int,
        max_new_tokens: int,
        *,
        prompt_ids: list[int] | None = None,
        sampling: Sampling | None = None,
    ) -> TurnGeneration:
        """One turn's generation (reported as phase ``generate``): retries on failure, continues after an abort.

        Env episodes send the trajectory's own prompt (with its images); agent sessions pass their own
        ``prompt_ids`` and the request's ``sampling`` (temperature, top_p, top_k, stop, seed; None keeps the
        config's). Validation stays greedy.
        """
        self.phases.set_phase("generate", turn)
        gen_cfg = self.generation
        if prompt_ids is None:
            prompt, multi_modal_data = self.observations.engine_prompt(trajectory)
        else:  # an agent session's own prompt (text only)
            prompt, multi_modal_data = list(prompt_ids), None
        temperature, top_p, top_k = gen_cfg.temperature, gen_cfg.top_p, gen_cfg.top_k
        stop, seed = list(self.stop), None
        if sampling is not None:
            temperature = (
                temperature if sampling.temperature is None else sampling.temperature
            )
            top_p = top_p if sampling.top_p is None else sampling.top_p
            top_k = top_k if sampling.top_k is None else sampling.top_k
            stop, seed = list(sampling.stop), sampling.seed
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        token_versions: list[int] = []
        failures = resumed = idle_aborts = 0
        started = self._clock()
        started_at = time.time()
        finish = "length"
        while len(token_ids) < max_new_tokens:
            request = GenerationRequest(
                request_id=f"{self.request_prefix}{trajectory.traj_id}-env{self.env_id}-t{turn}-r{next(self._request_counter)}",
                prompt_token_ids=prompt + token_ids,
                max_tokens=max_new_tokens - len(token_ids),
                temperature=0.0 if self.greedy else temperature,
                top_p=1.0 if self.greedy else top_p,
                top_k=-1 if self.greedy else top_k,
                stop=stop,
                seed=seed,
                logprobs=True,
                multi_modal_data=multi_modal_data,
                adapter_lag=self.adapter_lag,
            )
            error: Exception | None = None
            try:
                # no extra Task per request, unlike wait_for
                async with asyncio.timeout(gen_cfg.request_timeout_s):
                    result = await self.engine.generate(request)
            except asyncio.CancelledError:
                await self._abort_quietly(request.request_id)
                raise
            except Exception as exc:
                await self._abort_quietly(request.request_id)
                error = exc
            else:
                # vLLM's retryable fault: its partial output is dropped
                if result.finish_reason == "error":
                    error = RuntimeError(
                        f"finish reason 'error' after {len(result.output_token_ids)} tokens"
                    )
            if error is not None:
                failures += 1
                if failures > gen_cfg.max_retries:
                    raise EngineRequestError(
                        f"engine request {request.request_id} failed for env {self.env_id} (tag {trajectory.tag}), "
                        f"turn {turn}, after {failures} attempts: {type(error).__name__}: {error}"
                    ) from error
                self.stats.engine_retries += 1
                logger.warning(
                    "engine request %s failed (%s); retry %d/%d",
                    request.request_id,
                    error,
                    failures,
                    gen_cfg.max_retries,
                )
                await asyncio.sleep(gen_cfg.retry_backoff_s * 2 ** (failures - 1))
                continue
            expected_prompt = len(trajectory.token_ids) + len(token_ids)
            if (
                multi_modal_data
                and result.finish_reason != "abort"
                and result.num_prompt_tokens != expected_prompt
            ):
                raise EngineRequestError(
                    f"engine expanded the images of request {request.request_id} to a {result.num_prompt_tokens}-id "
                    f"prompt but the trajectory has {expected_prompt} ids: the engine's processor differs from the "
                    "rollout's (model.path must name one model directory for both)"
                )
            added = append_generation(
                result, token_ids, logprobs, versions, token_versions
            )
            if resumed and self._cut_at_split_stop(
                stop, token_ids, logprobs, versions, token_versions
            ):
                finish = "stop"
                break
            if result.finish_reason != "abort":
                finish = result.finish_reason
                break
            resumed += 1
            self.stats.resumed_generations += 1
            idle_aborts = 0 if added else idle_aborts + 1
            if idle_aborts:
                await asyncio.sleep(
                    min(
                        _MAX_ABORT_BACKOFF_S,
                        self.abort_backoff_s * 2 ** (idle_aborts - 1),
                    )
                )
        return TurnGeneration(
            token_ids,
            logprobs,
            finish,
            versions,
            resumed,
            self._clock() - started,
            token_versions,
            started_at,
            time.time(),
        )

    def _cut_at_split_stop(
        self,
        stop: list[str],
        token_ids: list[int],
        logprobs: list[float],
        versions: list[int],
        token_versions: list[int],
    ) -> bool:
        """After a continuation: end the turn at a stop string the joined output holds (in place); True if so.

        A stop string the last piece ended on by itself is the engine's own cut and is left as it is.
        """
        if self.decode is None or not stop:
            return False
        end = stop_string_end(self.decode, token_ids, stop)
        if end is None:
            return False
        del token_ids[end:], logprobs[end:], token_versions[end:]
        versions[:] = [
            v
            for i, v in enumerate(token_versions)
            if i == 0 or token_versions[i - 1] != v
        ]
        return True

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.wait_for(
                self.engine.abort([request_id]), timeout=_ABORT_TIMEOUT_S
            )
        except Exception:
            logger.debug("abort of %s failed", request_id, exc_info=True)
