"""EnvManager: one env instance's rollout loop, independent of every other env.

``run_rollout_loop`` repeats: ask the scheduler for an episode (it may wait
there, never on another env), reset the env with the episode's seed, play
turns, hand the trajectory back. A turn is token-in/token-out: the prompt ids
are the previous prompt ids, plus the engine's output ids exactly as returned,
plus the chat-template closure and user delta (``roll_async.prompts.prompt_builder``);
nothing already sent is ever re-tokenized. Text is decoded only to hand the
action to the env. Observation images (``render_mode: vision``) are expanded
once into ids by the model's processor and sent with every later request
(``roll_async.prompts.images``).

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

Engine faults: a request that raises (or exceeds ``request_timeout_s``), or
that comes back with vLLM's retryable ``error`` finish reason (its partial
output is discarded, never trained on), is
retried ``max_retries`` times with exponential backoff, then
``EngineRequestError`` names env, turn and request and ends the loop (the host
reports it and ``get_batch`` raises it). A request that comes back with finish
reason ``abort`` (engine paused for a weight update, or aborted) is NOT thrown
away: the turn continues from the partial output (prompt + partial ids, fewer
max_tokens), with the behaviour logprobs of every piece kept and the weight
versions of all pieces recorded; ``TurnRecord.resumed_generations`` counts it.
Every generated token keeps the weight version that sampled it
(``Trajectory.token_versions``, -1 on prompt and env tokens);
``TurnRecord.weight_versions`` lists the turn's versions in order.

Sync env methods run in a thread pool with a timeout so a slow or hung env
never blocks the event loop that hosts the other envs; ``async def`` methods
are awaited with the same timeout. An env call that was interrupted (timeout or
episode cancelled mid-call) leaves the env in an unknown state, so that
instance is abandoned and a fresh one built. After a timeout the hung thread
cannot be killed; this manager then moves to a private one-thread executor so
the shared pool does not shrink, and the env is closed by that thread as soon
as its call returns (never leaked). The timeout counts from when the call starts
running, not while it waits for a free thread. For an env that must really be
stopped, ``custom_envs.<Tag>.isolation: process`` runs it in a child process
that is killed at the timeout (``roll_async.env_service``); a tag with
``service_url`` runs on an env server. If no env server of a tag answers after
the client's retries, ``EnvServiceUnavailable`` ends the loop like an engine
failure: ``get_batch`` reports it as the root cause. ``isolation: inline`` is the
other way: for envs whose calls take microseconds, a thread hop (two cross-thread
wake-ups and the GIL handed back and forth) costs more than the call, so their sync
calls run on the event loop itself; a call that overran the timeout fails its
episode once it returns, but nothing can interrupt it.

The scheduler may cancel the current episode (``cancel_episode``: its group
completed without it, or sync mode suspended): the in-flight engine request is
aborted and the partial episode discarded.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.config.schema import CustomEnvConfig, GenerationConfig
from roll_async.engine.router import EngineClient
from roll_async.errors import (
    ChatTemplateError,
    EngineRequestError,
    EnvCallError,
    EnvServiceUnavailable,
    VisionInputError,
)
from roll_async.metrics import PREFIX_CHECK_EVERY_EPISODES, PREFIX_MISMATCH
from roll_async.prompts.images import (
    ObservationEncoder,
    append_images,
    observation_images,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trajectory import (
    EpisodeSpec,
    GenerationRequest,
    GenerationResult,
    Trajectory,
    TurnRecord,
)

logger = logging.getLogger(__name__)

#: How long to wait for an engine abort or an env close before giving up on it.
_CLEANUP_TIMEOUT_S = 5.0
#: Least time an out-of-process env gets to start (``env.prepare()``: fork a process, create a server instance).
_ENV_PREPARE_TIMEOUT_S = 120.0
#: Longest pause between continuations when the engine keeps aborting without producing tokens.
_MAX_ABORT_BACKOFF_S = 1.0

EnvBuilder = Callable[[dict[str, Any]], Any]


class EpisodeScheduler(Protocol):
    """What an EnvManager needs from the scheduler (a GroupQueueManager or a Ray adapter to one).

    A scheduler may also offer ``put_trajectory_and_next_episode(trajectory)``: both calls in one,
    which over Ray is one round trip per episode instead of two. The EnvManager uses it when present.
    """

    async def next_episode(self, env_id: int) -> EpisodeSpec | None: ...

    async def put_trajectory(self, trajectory: Trajectory) -> None: ...


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
        return self.phase in (
            "build_env",
            "reset",
            "generate",
            "env_step",
            "handing_over",
        )


@dataclass
class EnvManagerStats:
    episodes: int = 0
    env_errors: int = 0
    env_timeouts: int = 0
    env_builds: int = 0
    cancelled_episodes: int = 0
    resumed_generations: int = 0
    engine_retries: int = 0
    #: CPU seconds the env's own sync calls used (their threads'), so benchmarks can tell env work from ours.
    env_cpu_s: float = 0.0


@dataclass
class _Generation:
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


def _close_env_now(env: Any) -> None:
    """Close ``env`` in the calling thread (an abandoned call's thread, once the call returned)."""
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        result = close()
        if inspect.isawaitable(result):
            asyncio.run(_await(result))
    except Exception:
        logger.debug("closing an abandoned env failed", exc_info=True)


async def _await(awaitable: Any) -> Any:
    return await awaitable


class _ThreadCall:
    """One sync env call in a thread: timed from when it starts running; cleans up after itself if abandoned.

    ``env`` is the env the call runs on; None means the call builds an env (make_env) and its result is the
    env to close if nobody waits for it any more. The thread records when the call starts and how much CPU
    it used; the event loop learns the start time only when its timer checks (no wake-up per start), so a
    call costs one thread hop and one timer.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], env: Any) -> None:
        self.fn, self.args, self.env = fn, args, env
        self._lock = threading.Lock()
        self._finished = self._abandoned = False
        self.started_at: float | None = (
            None  # on the event loop's clock, read in the thread
        )
        self.cpu_s = 0.0  # the call's own CPU time (its thread's), for the rollout's CPU accounting

    def _call(self, clock: Callable[[], float]) -> Any:
        self.started_at = clock()
        cpu0 = time.thread_time()
        result = None
        try:
            result = self.fn(*self.args)
            return result
        finally:
            self.cpu_s = time.thread_time() - cpu0
            with self._lock:
                self._finished = True
                abandoned = self._abandoned
            if abandoned:
                _close_env_now(self.env if self.env is not None else result)

    async def run(self, executor: Executor | None, timeout: float) -> Any:
        """The call's result; TimeoutError once it has RUN for ``timeout`` s (time queued for a thread is free)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(executor, self._call, loop.time)
        async with asyncio.timeout(None) as scope:
            timer: asyncio.TimerHandle | None = None

            def check() -> None:
                nonlocal timer
                started = self.started_at
                if (
                    started is None
                ):  # still queued behind other calls: look again a timeout later
                    timer = loop.call_later(timeout, check)
                else:
                    scope.reschedule(
                        started + timeout
                    )  # in the past: the scope times out now

            timer = loop.call_later(timeout, check)
            try:
                return await future
            except asyncio.CancelledError:
                future.cancel()  # a call still queued never runs
                raise
            finally:
                timer.cancel()

    def abandon(self) -> bool:
        """Nobody waits for the result any more; True if the call is still running (its thread cleans up)."""
        with self._lock:
            self._abandoned = True
            return not self._finished


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
        agent_gateway: Any = None,
        agent_model_name: str = "",
        observations: ObservationEncoder | None = None,
    ) -> None:
        self.env_id = env_id
        #: Makes request ids unique across schedulers sharing an engine (train and val, restarts).
        self.request_prefix = request_prefix
        self.settings = settings
        self._make_env = make_env
        self.scheduler = scheduler
        self.engine = engine
        self.prompts = prompt_builder
        #: Observation text and ids; with a VisionProcessor, images are expanded once here (roll_async.prompts.images).
        self.observations = observations or ObservationEncoder(None)
        self._executor = executor
        self._inline = settings.custom_env.isolation == "inline"
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
        #: Agent tags (custom_envs.<Tag>.agent): the worker's loopback chat endpoint and the model id it serves.
        self.agent_gateway = agent_gateway
        self.agent_model_name = agent_model_name

    # -- loop --------------------------------------------------------------------------

    async def run_rollout_loop(self) -> None:
        """Play episodes until the scheduler says stop (None) or the loop is cancelled."""
        hand_over_and_next = getattr(
            self.scheduler, "put_trajectory_and_next_episode", None
        )
        spec: EpisodeSpec | None = None
        try:
            while not self._stopping:
                if spec is None:
                    self._set_phase("waiting_for_episode")
                    requested_at = time.time()
                    spec = await self.scheduler.next_episode(self.env_id)
                    if spec is None:
                        break
                trajectory = await self._play(spec, requested_at)
                spec = None
                if trajectory is None:
                    continue
                if hand_over_and_next is None or self._stopping:
                    self._set_phase("handing_over")
                    await self.scheduler.put_trajectory(trajectory)
                    continue
                # The hand-over is an in-memory append; the call then waits for a seat like next_episode.
                self._set_phase("waiting_for_episode")
                requested_at = time.time()
                spec = await hand_over_and_next(trajectory)
                if spec is None:
                    break
        finally:
            self._set_phase("stopped")
            self._discard_env()

    async def _play(
        self, spec: EpisodeSpec, requested_at: float = 0.0
    ) -> Trajectory | None:
        """One episode as its own task, so the scheduler can cancel it without stopping the loop."""
        self._current = spec
        self._cancel_requested = False
        task = asyncio.create_task(
            self._run_episode(spec, requested_at),
            name=f"env{self.env_id}-g{spec.group_id}-e{spec.episode_id}",
        )
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
            if (
                end_episode is not None
            ):  # a Router releases the episode's replica binding
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

    async def wait_closed(self, timeout: float = _CLEANUP_TIMEOUT_S) -> None:
        """Wait (bounded) for env closes still running in the background (a remote env's DELETE, a process kill)."""
        pending = [task for task in self._background if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

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

    async def _run_episode(
        self, spec: EpisodeSpec, requested_at: float = 0.0
    ) -> Trajectory:
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
        trajectory.episode_requested_at = requested_at or trajectory.started_at
        if cfg.agent:
            from roll_async.env_managers.agent_session import run_agent_episode

            return await run_agent_episode(self, spec, trajectory)
        try:
            await self._ensure_env(spec.env_config_override)
            self._set_phase("reset")
            observation, info = await self._call_env("reset", spec.seed)
        except EnvCallError as exc:
            return self._fail(trajectory, exc)

        info = info if isinstance(info, dict) else {}
        fields = {
            "instruction": str(info.get("instruction") or ""),
            "observation": self.observations.text(observation),
            "reward": 0.0,
            "turn": 0,
        }
        user_texts = [self._render("instruction_template", fields)]
        generated_per_turn: list[list[int]] = []
        try:
            first = self.observations.encode(
                self.prompts.first_turn_ids(user_texts[0]), observation
            )
        except VisionInputError as exc:
            return self._fail(trajectory, exc)
        first = first.fit(seq_len)  # never cuts an image in half
        append_images(trajectory, 0, first)
        self._append(trajectory, first.token_ids, generated=False)
        trajectory.prompt_length = len(first.token_ids)

        stop_reason = "max_steps"
        for turn in range(cfg.max_steps):
            budget = seq_len - len(trajectory.token_ids)
            if budget <= 0:
                stop_reason = "max_length"
                break
            self._set_phase("generate", turn)
            generation = await self._generate(
                trajectory, turn, min(cfg.max_tokens_per_step, budget)
            )
            self._append(
                trajectory,
                generation.token_ids,
                generated=True,
                logprobs=generation.logprobs,
                versions=generation.token_versions,
            )
            generated_per_turn.append(list(generation.token_ids))
            action_text = self.prompts.decode(generation.token_ids)
            record = generation.turn_record(turn, action_text)
            trajectory.turns.append(record)
            self._note_versions(trajectory, generation.weight_versions)
            sequence_full = len(trajectory.token_ids) >= seq_len
            if sequence_full and generation.finish_reason != "stop":
                stop_reason = "max_length"  # the reply was cut by sequence_length: do not act on half an action
                break

            self._set_phase("env_step", turn)
            started = self._clock()
            record.env_step_started_at = time.time()
            try:
                observation, reward, terminated, truncated, info = await self._call_env(
                    "step", action_text
                )
            except EnvCallError as exc:
                record.env_step_s = self._clock() - started
                record.env_step_finished_at = time.time()
                return self._fail(trajectory, exc)
            record.env_step_s = self._clock() - started
            record.env_step_finished_at = time.time()
            try:
                self.observations.check(observation)
            except VisionInputError as exc:
                return self._fail(trajectory, exc)
            record.observation = self.observations.text(observation)
            record.num_images = len(observation_images(observation))
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
            fields = {
                **fields,
                "observation": record.observation,
                "reward": record.reward,
                "turn": turn + 1,
            }
            user_texts.append(self._render("observation_template", fields))
            delta_ids = self.prompts.closure_ids_after(
                generation.token_ids
            ) + self.prompts.user_delta_ids(user_texts[-1])
            try:
                delta = self.observations.encode(delta_ids, observation)
            except VisionInputError as exc:
                return self._fail(trajectory, exc)
            room = seq_len - len(trajectory.token_ids)
            if (
                len(delta.token_ids) >= room
            ):  # no room left for even one generated token after this observation
                delta = delta.fit(room)  # an image that does not fit whole is left out
                append_images(trajectory, len(trajectory.token_ids), delta)
                self._append(trajectory, delta.token_ids, generated=False)
                stop_reason = "max_length"
                break
            append_images(trajectory, len(trajectory.token_ids), delta)
            self._append(trajectory, delta.token_ids, generated=False)

        trajectory.stop_reason = stop_reason
        trajectory.metrics = _episode_metrics(trajectory.turns)
        if self.stats.episodes % PREFIX_CHECK_EVERY_EPISODES == 0:
            self._check_prefix(trajectory, user_texts, generated_per_turn)
        trajectory.finished_at = time.time()
        self.stats.episodes += 1
        return trajectory

    def _check_prefix(
        self, trajectory: Trajectory, user_texts: list[str], generated: list[list[int]]
    ) -> None:
        """Does a fresh render of this conversation's text differ from its ids? (rollout/prefix_mismatch_rate)"""
        if trajectory.images:
            return  # image placeholders are expanded by the processor: a text-only render is not comparable
        try:
            differs = self.prompts.fresh_render_differs(
                trajectory.token_ids, user_texts, generated
            )
        except ChatTemplateError:
            return  # the template cannot render this history from text at all; nothing to compare
        trajectory.metrics[PREFIX_MISMATCH] = float(differs)

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
    def _append(
        trajectory: Trajectory,
        ids: list[int],
        *,
        generated: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        trajectory.token_ids.extend(ids)
        trajectory.response_mask.extend([1 if generated else 0] * len(ids))
        if generated and logprobs is not None:
            trajectory.logprobs.extend(logprobs)
        else:
            trajectory.logprobs.extend([0.0] * len(ids))
        if generated and versions is not None and len(versions) == len(ids):
            trajectory.token_versions.extend(versions)
        else:
            trajectory.token_versions.extend([-1] * len(ids))

    @staticmethod
    def _note_versions(trajectory: Trajectory, versions: list[int]) -> None:
        for version in versions:
            if (
                trajectory.oldest_weight_version is None
                or version < trajectory.oldest_weight_version
            ):
                trajectory.oldest_weight_version = version
            if (
                trajectory.newest_weight_version is None
                or version > trajectory.newest_weight_version
            ):
                trajectory.newest_weight_version = version

    def _fail(self, trajectory: Trajectory, exc: BaseException) -> Trajectory:
        trajectory.stop_reason = "env_error"
        trajectory.error = str(exc)
        trajectory.finished_at = time.time()
        self.stats.env_errors += 1
        self._env_dirty = True
        logger.warning(
            "env %s (tag %s) episode %s failed: %s",
            self.env_id,
            trajectory.tag,
            trajectory.traj_id,
            exc,
        )
        return trajectory

    # -- engine ------------------------------------------------------------------------

    async def _generate(
        self,
        trajectory: Trajectory,
        turn: int,
        max_new_tokens: int,
        *,
        prompt_ids: list[int] | None = None,
        sampling: Any = None,
    ) -> _Generation:
        """One turn's generation: retries on failure, continues after an abort; see module docstring.

        Agent sessions pass their own ``prompt_ids`` and the request's ``sampling``
        (temperature, top_p, top_k, stop, seed; None keeps the config's); validation stays greedy.
        """
        gen_cfg = self.settings.generation
        if prompt_ids is None:
            prompt, multi_modal_data = self.observations.engine_prompt(trajectory)
        else:  # an agent session's own prompt (text only)
            prompt, multi_modal_data = list(prompt_ids), None
        temperature, top_p, top_k = gen_cfg.temperature, gen_cfg.top_p, gen_cfg.top_k
        stop, seed = list(self.settings.custom_env.stop), None
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
                temperature=0.0 if self.settings.greedy else temperature,
                top_p=1.0 if self.settings.greedy else top_p,
                top_k=-1 if self.settings.greedy else top_k,
                stop=stop,
                seed=seed,
                logprobs=True,
                multi_modal_data=multi_modal_data,
            )
            error: Exception | None = None
            try:
                async with asyncio.timeout(
                    gen_cfg.request_timeout_s
                ):  # no extra Task per request, unlike wait_for
                    result = await self.engine.generate(request)
            except asyncio.CancelledError:
                await self._abort_quietly(request.request_id)
                raise
            except Exception as exc:
                await self._abort_quietly(request.request_id)
                error = exc
            else:
                if (
                    result.finish_reason == "error"
                ):  # vLLM's retryable fault: its partial output is dropped
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
                        self.settings.abort_backoff_s * 2 ** (idle_aborts - 1),
                    )
                )
        return _Generation(
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

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.wait_for(
                self.engine.abort([request_id]), timeout=_CLEANUP_TIMEOUT_S
            )
        except Exception:
            logger.debug("abort of %s failed", request_id, exc_info=True)

    # -- env calls ---------------------------------------------------------------------

    async def _ensure_env(self, override: dict[str, Any] | None) -> None:
        desired = {**dict(self.settings.custom_env.env_config), **(override or {})}
        if (
            self._env is not None
            and not self._env_dirty
            and desired == self._env_config
        ):
            return
        self._discard_env()
        self._set_phase("build_env")
        env = await self._run_with_timeout(
            self._make_env, desired, what="make_env"
        )  # env=None: close what it builds
        self._env, self._env_config, self._env_dirty = env, desired, False
        if inspect.iscoroutinefunction(getattr(env, "prepare", None)):
            # An out-of-process env starts its process / server instance here, so reset/step timeouts
            # measure only the env's own calls.
            timeout = max(self.settings.env_step_timeout_s, _ENV_PREPARE_TIMEOUT_S)
            await self._run_with_timeout(
                env.prepare, what="env.prepare", env=env, timeout=timeout
            )
        self.stats.env_builds += 1

    async def _call_env(self, method_name: str, *args: Any) -> Any:
        env = self._env
        return await self._run_with_timeout(
            getattr(env, method_name), *args, what=f"env.{method_name}", env=env
        )

    async def _run_with_timeout(
        self,
        fn: Callable[..., Any],
        *args: Any,
        what: str,
        env: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Await ``fn(*args)`` (async) or run it in the thread pool (sync; on the loop with ``isolation: inline``),
        within env_step_timeout_s.

        The timeout counts from when the call starts running, not while it waits for a free thread. An
        interrupted sync call (timeout or cancellation) keeps its thread until it returns; then ``env`` (or,
        for make_env, the env it built) is closed in that thread, so no env leaks. An interrupted async call
        is cancelled (a ProcessEnv kills its child process) and its env closed by ``_discard_env``.
        """
        timeout = timeout or self.settings.env_step_timeout_s
        thread_call: _ThreadCall | None = None
        try:
            if inspect.iscoroutinefunction(fn):
                async with asyncio.timeout(
                    timeout
                ):  # one deadline for the call; no extra Task per call
                    result = await fn(*args)
            else:
                if self._inline:
                    result = self._call_inline(fn, args, env, timeout)
                else:
                    thread_call = _ThreadCall(fn, args, env)
                    result = await thread_call.run(self._executor, timeout)
                    self.stats.env_cpu_s += thread_call.cpu_s
                if inspect.isawaitable(result):
                    async with asyncio.timeout(timeout):
                        result = await result
            return result
        except TimeoutError:
            self.stats.env_timeouts += 1
            self._env_dirty = True
            if thread_call is not None and thread_call.abandon():
                self._env_maybe_busy = (
                    True  # its thread closes the env when the call returns
                )
                self._move_off_hung_thread()
            raise EnvCallError(
                f"{what} exceeded env_step_timeout_s={timeout}s"
            ) from None
        except asyncio.CancelledError:
            self._env_dirty = True  # interrupted mid-call: the env's state is unknown
            if thread_call is not None and thread_call.abandon():
                self._env_maybe_busy = True
            raise
        except EnvServiceUnavailable:
            raise  # no env server of the tag answers: the rollout cannot go on (get_batch reports it)
        except Exception as exc:
            self._env_dirty = True
            raise EnvCallError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    def _call_inline(
        self, fn: Callable[..., Any], args: tuple[Any, ...], env: Any, timeout: float
    ) -> Any:
        """``isolation: inline``: call on the event loop; an overrun is a timeout once the call returns."""
        started, cpu0 = time.monotonic(), time.thread_time()
        result = fn(*args)
        self.stats.env_cpu_s += time.thread_time() - cpu0
        if time.monotonic() - started > timeout:
            if env is None:
                _close_env_now(
                    result
                )  # make_env overran: the env it built is not used (a used env is discarded)
            raise TimeoutError
        return result

    def _move_off_hung_thread(self) -> None:
        """A timed-out sync call keeps its thread; continue on a private thread so the shared pool keeps its size."""
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"env{self.env_id}"
        )

    def _discard_env(self) -> None:
        """Forget the current env; close it in the background unless it may still be running a call."""
        env, busy = self._env, self._env_maybe_busy
        self._env, self._env_config, self._env_dirty, self._env_maybe_busy = (
            None,
            None,
            False,
            False,
        )
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
            elif self._inline:
                close()
            else:
                future = asyncio.get_running_loop().run_in_executor(
                    self._executor, close
                )
                await asyncio.wait_for(future, _CLEANUP_TIMEOUT_S)
        except Exception:
            logger.debug("env %s close failed", self.env_id, exc_info=True)
