"""EnvManager: one env instance's rollout loop, independent of every other env.

``run_rollout_loop`` repeats: ask the scheduler for an episode (it may wait
there, never on another env), reset the env with the episode's seed, play
turns, hand the trajectory back. A turn is token-in/token-out: the prompt ids
are the previous prompt ids, plus the engine's output ids exactly as returned,
plus the chat-template closure and user delta (``roll_async.tokenization``);
nothing already sent is ever re-tokenized. Text is decoded only to hand the
action to the env.

Per turn the engine gets ``max_tokens = min(max_tokens_per_step,
sequence_length - current_length)`` and the env's stop strings. An episode ends
with stop reason:

* ``terminated``: the env said so;
* ``max_steps``: ``custom_env.max_steps`` turns played, or the env truncated;
* ``max_length``: the conversation reached ``sequence_length``. A reply cut by
  that limit is kept (it was generated) but not sent to the env; an observation
  that does not leave room for one more generated token is cut to fit and the
  episode ends;
* ``env_error``: ``make_env``/``reset``/``step`` raised or exceeded
  ``env_step_timeout_s``. The env instance is discarded and rebuilt for the
  next episode; the scheduler counts the error and re-opens the seat.

Engine faults: a request that raises (or exceeds ``request_timeout_s``) is
retried ``max_retries`` times with exponential backoff, then
``EngineRequestError`` names env, turn and request and ends the loop (the host
reports it and ``get_batch`` raises it). A request that comes back with finish
reason ``abort`` (engine paused for a weight update, or aborted) is NOT thrown
away: the turn continues from the partial output (prompt + partial ids, fewer
max_tokens), with the behaviour logprobs of every piece kept and the weight
versions of all pieces recorded; ``TurnRecord.resumed_generations`` counts it.

Sync env methods run in a thread pool with a timeout so a slow or hung env
never blocks the event loop that hosts the other envs; ``async def`` methods
are awaited with the same timeout. An env call that was interrupted (timeout or
episode cancelled mid-call) leaves the env in an unknown state, so that
instance is abandoned and a fresh one built. After a timeout the hung thread
cannot be killed; this manager then moves to a private one-thread executor so
the shared pool does not shrink.

The scheduler may cancel the current episode (``cancel_episode``: its group
completed without it, or sync mode suspended): the in-flight engine request is
aborted and the partial episode discarded.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.config import CustomEnvConfig, GenerationConfig
from roll_async.engine.router import EngineClient
from roll_async.protocol import EpisodeSpec, GenerationRequest, GenerationResult, Trajectory, TurnRecord
from roll_async.tokenization import ChatPromptBuilder

logger = logging.getLogger(__name__)

#: How long to wait for an engine abort or an env close before giving up on it.
_CLEANUP_TIMEOUT_S = 5.0
#: Longest pause between continuations when the engine keeps aborting without producing tokens.
_MAX_ABORT_BACKOFF_S = 1.0

EnvBuilder = Callable[[dict[str, Any]], Any]


class EpisodeScheduler(Protocol):
    """What an EnvManager needs from the scheduler (a GroupQueueManager or a Ray adapter to one)."""

    async def next_episode(self, env_id: int) -> EpisodeSpec | None: ...

    async def put_trajectory(self, trajectory: Trajectory) -> None: ...


class EngineRequestError(RuntimeError):
    """An engine request failed after its retries; ends the rollout loop."""


class EnvCallError(RuntimeError):
    """make_env / reset / step raised or timed out."""


@dataclass
class EnvManagerSettings:
    """Everything an EnvManager needs to know about its tag and limits."""

    tag: str
    custom_env: CustomEnvConfig
    sequence_length: int
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    env_step_timeout_s: float = 60.0
    #: Validation: temperature 0.
    greedy: bool = False
    #: First pause when the engine answers 'abort' without any new token (it is paused); doubles up to 1 s.
    abort_backoff_s: float = 0.02


@dataclass
class EnvProgress:
    """What the env is doing, for the watchdog."""

    phase: str = "idle"
    last_progress_at: float = 0.0
    group_id: int | None = None
    episode_id: int | None = None
    turn: int | None = None

    @property
    def busy(self) -> bool:
        """Phases in which the env itself should make progress (waiting for the scheduler is not one)."""
        return self.phase in ("build_env", "reset", "generate", "env_step", "handing_over")


@dataclass
class EnvManagerStats:
    episodes: int = 0
    env_errors: int = 0
    env_timeouts: int = 0
    env_builds: int = 0
    cancelled_episodes: int = 0
    resumed_generations: int = 0
    engine_retries: int = 0


@dataclass
class _Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_versions: list[int]
    resumed: int
    seconds: float


def append_generation(
    result: GenerationResult, token_ids: list[int], logprobs: list[float], versions: list[int]
) -> int:
    """Append one engine result of a turn (ids, logprobs padded with 0.0 where missing, version); returns ids added.

    A turn may take several results when an abort interrupts it; each piece is kept as the engine returned it.
    """
    new_ids = list(result.output_token_ids)
    new_logprobs = list(result.logprobs)[: len(new_ids)]
    new_logprobs += [0.0] * (len(new_ids) - len(new_logprobs))
    token_ids.extend(new_ids)
    logprobs.extend(new_logprobs)
    versions.append(result.weight_version)
    return len(new_ids)


def observation_text(observation: Any) -> str:
    """Text of an observation: a str, or an object with ``.text`` (roll_async.envs.base.Observation)."""
    if isinstance(observation, str):
        return observation
    text = getattr(observation, "text", None)
    return text if isinstance(text, str) else str(observation)


def _numeric_metrics(info: Any) -> dict[str, float]:
    metrics = info.get("metrics", {}) if isinstance(info, dict) else {}
    out: dict[str, float] = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, (bool, int, float)):
            out[str(key)] = float(value)
    return out


def _episode_metrics(turns: list[TurnRecord]) -> dict[str, float]:
    """Mean of each env metric over the turns that reported it; ``success`` is the last turn's value."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for turn in turns:
        for key, value in turn.metrics.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    merged = {key: sums[key] / counts[key] for key in sums}
    for turn in reversed(turns):
        if "success" in turn.metrics:
            merged["success"] = turn.metrics["success"]
            break
    return merged


class EnvManager:
    """Runs episodes of one env instance; see the module docstring for the rules."""

    def __init__(
        self,
        env_id: int,
        settings: EnvManagerSettings,
        *,
        make_env: EnvBuilder,
        scheduler: EpisodeScheduler,
        engine: EngineClient,
        prompt_builder: ChatPromptBuilder,
        executor: Executor | None = None,
        request_prefix: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env_id = env_id
        #: Makes request ids unique across schedulers sharing an engine (train and val, restarts).
        self.request_prefix = request_prefix
        self.settings = settings
        self._make_env = make_env
        self.scheduler = scheduler
        self.engine = engine
        self.prompts = prompt_builder
        self._executor = executor
        self._clock = clock
        self.stats = EnvManagerStats()
        self.progress = EnvProgress(last_progress_at=clock())
        self._env: Any = None
        self._env_config: dict[str, Any] | None = None
        self._env_dirty = False
        self._env_maybe_busy = False
        self._current: EpisodeSpec | None = None
        self._episode_task: asyncio.Task | None = None
        self._cancel_requested = False
        self._stopping = False
        self._request_counter = itertools.count()
        self._background: set[asyncio.Task] = set()

    # -- loop --------------------------------------------------------------------------

    async def run_rollout_loop(self) -> None:
        """Play episodes until the scheduler says stop (None) or the loop is cancelled."""
        try:
            while not self._stopping:
                self._set_phase("waiting_for_episode")
                spec = await self.scheduler.next_episode(self.env_id)
                if spec is None:
                    break
                trajectory = await self._play(spec)
                if trajectory is None:
                    continue
                self._set_phase("handing_over")
                await self.scheduler.put_trajectory(trajectory)
        finally:
            self._set_phase("stopped")
            self._discard_env()

    async def _play(self, spec: EpisodeSpec) -> Trajectory | None:
        """One episode as its own task, so the scheduler can cancel it without stopping the loop."""
        self._current = spec
        self._cancel_requested = False
        task = asyncio.create_task(self._run_episode(spec), name=f"env{self.env_id}-g{spec.group_id}-e{spec.episode_id}")
        self._episode_task = task
        try:
            return await task
        except asyncio.CancelledError:
            if self._cancel_requested and not self._stopping:
                self.stats.cancelled_episodes += 1
                return None
            raise
        finally:
            self._episode_task = None
            self._current = None
            end_episode = getattr(self.engine, "end_episode", None)
            if end_episode is not None:  # a Router releases the episode's replica binding
                end_episode()

    def cancel_episode(self, group_id: int, episode_id: int) -> bool:
        """Cancel the current episode if it is (group_id, episode_id); True if something was cancelled."""
        current, task = self._current, self._episode_task
        if current is None or task is None or task.done():
            return False
        if (current.group_id, current.episode_id) != (group_id, episode_id):
            return False
        self._cancel_requested = True
        task.cancel()
        return True

    def stop(self) -> None:
        """Make the loop end; the host cancels the loop task after this."""
        self._stopping = True

    def _set_phase(self, phase: str, turn: int | None = None) -> None:
        current = self._current
        self.progress = EnvProgress(
            phase=phase,
            last_progress_at=self._clock(),
            group_id=current.group_id if current else None,
            episode_id=current.episode_id if current else None,
            turn=turn,
        )

    # -- one episode -------------------------------------------------------------------

    async def _run_episode(self, spec: EpisodeSpec) -> Trajectory:
        cfg = self.settings.custom_env
        seq_len = self.settings.sequence_length
        trajectory = Trajectory(
            tag=spec.tag,
            group_id=spec.group_id,
            episode_id=spec.episode_id,
            env_id=self.env_id,
            seed=spec.seed,
            traj_id=f"{spec.tag}-g{spec.group_id}-e{spec.episode_id}",
            created_step=spec.created_step,
            started_at=time.time(),
        )
        try:
            await self._ensure_env(spec.env_config_override)
            self._set_phase("reset")
            observation, info = await self._call_env("reset", spec.seed)
        except EnvCallError as exc:
            return self._fail(trajectory, exc)

        info = info if isinstance(info, dict) else {}
        fields = {"instruction": str(info.get("instruction") or ""), "observation": observation_text(observation), "reward": 0.0, "turn": 0}
        prompt = self.prompts.first_turn_ids(self._render("instruction_template", fields))
        prompt = prompt[:seq_len]
        self._append(trajectory, prompt, generated=False)
        trajectory.prompt_length = len(prompt)

        stop_reason = "max_steps"
        for turn in range(cfg.max_steps):
            budget = seq_len - len(trajectory.token_ids)
            if budget <= 0:
                stop_reason = "max_length"
                break
            self._set_phase("generate", turn)
            generation = await self._generate(trajectory, turn, min(cfg.max_tokens_per_step, budget))
            self._append(trajectory, generation.token_ids, generated=True, logprobs=generation.logprobs)
            action_text = self.prompts.decode(generation.token_ids)
            record = TurnRecord(
                turn=turn,
                action_text=action_text,
                observation="",
                reward=0.0,
                generated_tokens=len(generation.token_ids),
                weight_version=generation.weight_versions[-1] if generation.weight_versions else -1,
                generate_s=generation.seconds,
                env_step_s=0.0,
                finish_reason=generation.finish_reason,
                resumed_generations=generation.resumed,
            )
            trajectory.turns.append(record)
            self._note_versions(trajectory, generation.weight_versions)
            sequence_full = len(trajectory.token_ids) >= seq_len
            if sequence_full and generation.finish_reason != "stop":
                stop_reason = "max_length"  # the reply was cut by sequence_length: do not act on half an action
                break

            self._set_phase("env_step", turn)
            started = self._clock()
            try:
                observation, reward, terminated, truncated, info = await self._call_env("step", action_text)
            except EnvCallError as exc:
                record.env_step_s = self._clock() - started
                return self._fail(trajectory, exc)
            record.env_step_s = self._clock() - started
            record.observation = observation_text(observation)
            record.reward = float(reward)
            record.metrics = _numeric_metrics(info)
            trajectory.episode_reward += record.reward

            if terminated:
                stop_reason = "terminated"
                break
            if truncated or turn == cfg.max_steps - 1:
                stop_reason = "max_steps"
                break
            if sequence_full:
                stop_reason = "max_length"
                break
            fields = {**fields, "observation": record.observation, "reward": record.reward, "turn": turn + 1}
            delta = self.prompts.closure_ids_after(generation.token_ids) + self.prompts.user_delta_ids(
                self._render("observation_template", fields)
            )
            room = seq_len - len(trajectory.token_ids)
            if len(delta) >= room:  # no room left for even one generated token after this observation
                self._append(trajectory, delta[:room], generated=False)
                stop_reason = "max_length"
                break
            self._append(trajectory, delta, generated=False)

        trajectory.stop_reason = stop_reason
        trajectory.metrics = _episode_metrics(trajectory.turns)
        trajectory.finished_at = time.time()
        self.stats.episodes += 1
        return trajectory

    def _render(self, template_name: str, fields: dict[str, Any]) -> str:
        template = getattr(self.settings.custom_env, template_name)
        try:
            return template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"custom_envs.{self.settings.tag}.{template_name}={template!r} cannot be filled ({type(exc).__name__}: {exc}); "
                f"it may use the fields {{{'}, {'.join(fields)}}} (write literal braces as {{{{ and }}}})"
            ) from None

    @staticmethod
    def _append(trajectory: Trajectory, ids: list[int], *, generated: bool, logprobs: list[float] | None = None) -> None:
        trajectory.token_ids.extend(ids)
        trajectory.response_mask.extend([1 if generated else 0] * len(ids))
        if generated and logprobs is not None:
            trajectory.logprobs.extend(logprobs)
        else:
            trajectory.logprobs.extend([0.0] * len(ids))

    @staticmethod
    def _note_versions(trajectory: Trajectory, versions: list[int]) -> None:
        for version in versions:
            if trajectory.oldest_weight_version is None or version < trajectory.oldest_weight_version:
                trajectory.oldest_weight_version = version
            if trajectory.newest_weight_version is None or version > trajectory.newest_weight_version:
                trajectory.newest_weight_version = version

    def _fail(self, trajectory: Trajectory, exc: BaseException) -> Trajectory:
        trajectory.stop_reason = "env_error"
        trajectory.error = str(exc)
        trajectory.finished_at = time.time()
        self.stats.env_errors += 1
        self._env_dirty = True
        logger.warning("env %s (tag %s) episode %s failed: %s", self.env_id, trajectory.tag, trajectory.traj_id, exc)
        return trajectory

    # -- engine ------------------------------------------------------------------------

    async def _generate(self, trajectory: Trajectory, turn: int, max_new_tokens: int) -> _Generation:
        """One turn's generation: retries on failure, continues after an abort; see module docstring."""
        gen_cfg = self.settings.generation
        prompt = list(trajectory.token_ids)
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        failures = resumed = idle_aborts = 0
        started = self._clock()
        finish = "length"
        while len(token_ids) < max_new_tokens:
            request = GenerationRequest(
                request_id=f"{self.request_prefix}{trajectory.traj_id}-env{self.env_id}-t{turn}-r{next(self._request_counter)}",
                prompt_token_ids=prompt + token_ids,
                max_tokens=max_new_tokens - len(token_ids),
                temperature=0.0 if self.settings.greedy else gen_cfg.temperature,
                top_p=1.0 if self.settings.greedy else gen_cfg.top_p,
                top_k=-1 if self.settings.greedy else gen_cfg.top_k,
                stop=list(self.settings.custom_env.stop),
                logprobs=True,
            )
            try:
                async with asyncio.timeout(gen_cfg.request_timeout_s):  # no extra Task per request, unlike wait_for
                    result = await self.engine.generate(request)
            except asyncio.CancelledError:
                await self._abort_quietly(request.request_id)
                raise
            except Exception as exc:
                await self._abort_quietly(request.request_id)
                failures += 1
                if failures > gen_cfg.max_retries:
                    raise EngineRequestError(
                        f"engine request {request.request_id} failed for env {self.env_id} (tag {trajectory.tag}), "
                        f"turn {turn}, after {failures} attempts: {type(exc).__name__}: {exc}"
                    ) from exc
                self.stats.engine_retries += 1
                logger.warning("engine request %s failed (%s); retry %d/%d", request.request_id, exc, failures, gen_cfg.max_retries)
                await asyncio.sleep(gen_cfg.retry_backoff_s * 2 ** (failures - 1))
                continue
            added = append_generation(result, token_ids, logprobs, versions)
            if result.finish_reason != "abort":
                finish = result.finish_reason
                break
            resumed += 1
            self.stats.resumed_generations += 1
            idle_aborts = 0 if added else idle_aborts + 1
            if idle_aborts:
                await asyncio.sleep(min(_MAX_ABORT_BACKOFF_S, self.settings.abort_backoff_s * 2 ** (idle_aborts - 1)))
        return _Generation(token_ids, logprobs, finish, versions, resumed, self._clock() - started)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.wait_for(self.engine.abort([request_id]), timeout=_CLEANUP_TIMEOUT_S)
        except Exception:
            logger.debug("abort of %s failed", request_id, exc_info=True)

    # -- env calls ---------------------------------------------------------------------

    async def _ensure_env(self, override: dict[str, Any] | None) -> None:
        desired = {**dict(self.settings.custom_env.env_config), **(override or {})}
        if self._env is not None and not self._env_dirty and desired == self._env_config:
            return
        self._discard_env()
        self._set_phase("build_env")
        env = await self._run_with_timeout(self._make_env, desired, what="make_env")
        self._env, self._env_config, self._env_dirty = env, desired, False
        self.stats.env_builds += 1

    async def _call_env(self, method_name: str, *args: Any) -> Any:
        return await self._run_with_timeout(getattr(self._env, method_name), *args, what=f"env.{method_name}")

    async def _run_with_timeout(self, fn: Callable[..., Any], *args: Any, what: str) -> Any:
        """Await ``fn(*args)`` (async) or run it in the thread pool (sync), within env_step_timeout_s."""
        timeout = self.settings.env_step_timeout_s
        try:
            async with asyncio.timeout(timeout):  # one deadline for the call; no extra Task per call
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args)
                else:
                    result = await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
                    if inspect.isawaitable(result):
                        result = await result
            return result
        except asyncio.TimeoutError:
            self.stats.env_timeouts += 1
            self._env_dirty = self._env_maybe_busy = True
            self._move_off_hung_thread()
            raise EnvCallError(f"{what} exceeded env_step_timeout_s={timeout}s") from None
        except asyncio.CancelledError:
            self._env_dirty = self._env_maybe_busy = True  # interrupted mid-call: the env's state is unknown
            raise
        except Exception as exc:
            self._env_dirty = True
            raise EnvCallError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    def _move_off_hung_thread(self) -> None:
        """A timed-out sync call keeps its thread; continue on a private thread so the shared pool keeps its size."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"env{self.env_id}")

    def _discard_env(self) -> None:
        """Forget the current env; close it in the background unless it may still be running a call."""
        env, busy = self._env, self._env_maybe_busy
        self._env, self._env_config, self._env_dirty, self._env_maybe_busy = None, None, False, False
        if env is None or busy:
            return
        close = getattr(env, "close", None)
        if close is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._close_quietly(close))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_quietly(self, close: Callable[[], Any]) -> None:
        try:
            if inspect.iscoroutinefunction(close):
                await asyncio.wait_for(close(), _CLEANUP_TIMEOUT_S)
            else:
                future = asyncio.get_running_loop().run_in_executor(self._executor, close)
                await asyncio.wait_for(future, _CLEANUP_TIMEOUT_S)
        except Exception:
            logger.debug("env %s close failed", self.env_id, exc_info=True)
