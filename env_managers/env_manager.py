"""Each env instance plays its episodes on its own, never waiting on another env;
this module is that per-env episode loop: take an episode from the scheduler,
build the trajectory turn by turn (engine turns via ``turn_generator``, env calls
via ``env_calls``, agent tags via ``agent_session``), and hand it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.agent_gateway.server import AgentGateway
from roll_async.config.schema import CustomEnvConfig, GenerationConfig
from roll_async.engine.router import EngineClient
from roll_async.env_managers.agent_session import (
    AgentEpisodeError,
    AgentEpisodeRunner,
)
from roll_async.env_managers.env_calls import ENV_CLOSE_TIMEOUT_S, EnvBuilder, EnvCaller
from roll_async.env_managers.env_status import (
    EnvManagerStats,
    EnvProgress,
    PhaseReporter,
)
from roll_async.env_managers.env_tools import EnvTools, EnvToolsError
from roll_async.env_managers.game_episode import FrozenSeat, GameEpisodeRunner
from roll_async.env_managers.trajectory_bookkeeping import (
    append_tokens,
    check_prefix,
    env_reference,
    episode_metrics,
    note_env_spans,
    note_versions,
    numeric_metrics,
)
from roll_async.env_managers.turn_generator import TurnGenerator
from roll_async.errors import EnvCallError, VisionInputError
from roll_async.metrics import PREFIX_CHECK_EVERY_EPISODES
from roll_async.prompts.images import (
    ObservationEncoder,
    append_images,
    observation_images,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.rewards.episode_text import turn_text
from roll_async.rewards.scorer import EpisodeRewardScorer
from roll_async.rewards.turn_rewards import TurnRewards
from roll_async.trajectory import EpisodeSpec, Trajectory

logger = logging.getLogger(__name__)

#: Seconds a cancel for an episode this env has not started yet is remembered (it may still be on its way).
EARLY_CANCEL_TTL_S = 600.0
#: Most such cancels remembered per env; the oldest go first.
EARLY_CANCEL_MAX = 256


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


class EnvManager:
    """Runs episodes of one env instance.

    :meth:`run_rollout_loop` repeats: ask the scheduler for an episode (it may
    wait there, never on another env), reset the env with the episode's seed,
    play turns, hand the trajectory back. A turn is token-in/token-out: the prompt
    ids are the previous prompt ids, plus the engine's output ids exactly as
    returned, plus the chat-template closure and user delta
    (``roll_async.prompts.prompt_builder``); nothing already sent is ever
    re-tokenized. Text is decoded only to hand the action to the env (and to a
    reward model: with a ``reward_scorer`` the finished episode is scored before
    it is handed back, or with ``per_turn`` each turn once its env step ends,
    all awaited before the hand-over; see ``roll_async.rewards``). Observation
    images (``render_mode: vision``) are expanded once into ids by the model's
    processor and sent with every later request (``roll_async.prompts.images``).
    Every generated token keeps the weight version that sampled it
    (``Trajectory.token_versions``, -1 on prompt and env tokens).

    Per turn the engine gets ``max_tokens = min(max_tokens_per_step,
    sequence_length - current_length)``. An episode ends with stop reason:

    * ``terminated``: the env said so;
    * ``max_steps``: ``custom_env.max_steps`` turns played, or the env truncated;
    * ``max_length``: the conversation reached ``sequence_length``. A reply cut
      by that limit is kept (it was generated) but not sent to the env; an
      observation that does not leave room for one more generated token is cut
      to fit and the episode ends;
    * ``env_error``: ``make_env``/``reset``/``step`` raised or exceeded
      ``env_step_timeout_s`` (:class:`EnvCaller`), or an agent episode failed.
      The env instance is discarded and rebuilt for the next episode; the
      scheduler counts the error and re-opens the seat.

    An engine request that still fails after its retries
    (:class:`EngineRequestError`, see :class:`TurnGenerator`), or no env server
    of a tag answering (``EnvServiceUnavailable``), ends the loop: the host
    reports it and ``get_batch`` raises it as the root cause. The scheduler may
    cancel the current episode (:meth:`cancel_episode`: its group completed
    without it, or sync mode suspended): the in-flight engine request is aborted
    and the partial episode discarded.
    """

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
        agent_gateway: AgentGateway | None = None,
        agent_model_name: str = "",
        agent_tool_parser: str | None = None,
        observations: ObservationEncoder | None = None,
        reward_scorer: EpisodeRewardScorer | None = None,
        frozen_seats: Mapping[int, FrozenSeat] | None = None,
        snapshot_engines: Mapping[int, EngineClient] | None = None,
    ) -> None:
        self.env_id = env_id
        #: custom_envs.<Tag>.reward: scores each finished episode (a judge or reward model); None: env reward only.
        self.reward_scorer = reward_scorer
        #: The current episode's per-turn scoring calls (reward.per_turn), cancelled when the episode ends early.
        self._turn_rewards: TurnRewards | None = None
        #: Makes request ids unique across schedulers sharing an engine (train and val, restarts).
        self.request_prefix = request_prefix
        self.settings = settings
        self.scheduler = scheduler
        self.engine = engine
        self.prompts = prompt_builder
        #: Observation text and ids; with a VisionProcessor, images are expanded once here (roll_async.prompts.images).
        self.observations = observations or ObservationEncoder(None)
        self._clock = clock
        self.stats = EnvManagerStats()
        #: The current episode's phase, for the watchdog (``progress``).
        self.phases = PhaseReporter(clock)
        #: The env instance and every call into it (timeouts, isolation).
        self.env_calls = EnvCaller(
            env_id,
            make_env,
            timeout_s=settings.env_step_timeout_s,
            stats=self.stats,
            executor=executor,
            inline=settings.custom_env.isolation == "inline",
        )
        #: Each turn's engine generation (retries, continuation after an abort).
        self.turns = TurnGenerator(
            env_id,
            engine,
            generation=settings.generation,
            stop=list(settings.custom_env.stop),
            observations=self.observations,
            stats=self.stats,
            phases=self.phases,
            greedy=settings.greedy,
            abort_backoff_s=settings.abort_backoff_s,
            request_prefix=request_prefix,
            clock=clock,
            decode=prompt_builder.decode,
        )
        self._episode_task: asyncio.Task[Any] | None = None
        self._cancel_requested = False
        #: (group_id, episode_id) -> when a cancel came for an episode not started yet (see cancel_episode).
        self._early_cancels: dict[tuple[int, int], float] = {}
        self._stopping = False
        #: Agent tags (custom_envs.<Tag>.agent): the worker's loopback chat endpoint and the model id it serves.
        self.agent_gateway = agent_gateway
        self.agent_model_name = agent_model_name
        #: ``model.tool_parser``: parses replies into calls for agent sessions and tool-using envs.
        self.tool_parser = agent_tool_parser
        self._agent_episodes = (
            AgentEpisodeRunner(
                settings,
                gateway=agent_gateway,
                model_name=agent_model_name,
                prompts=prompt_builder,
                turns=self.turns,
                tool_parser=agent_tool_parser,
                phases=self.phases,
                stats=self.stats,
                env_calls=self.env_calls,
                clock=clock,
            )
            if settings.custom_env.agent_function
            else None
        )
        #: Game tags (custom_envs.<Tag>.seats): one game per episode, a trajectory per policy seat.
        self._games = (
            GameEpisodeRunner(
                settings,
                self.env_calls,
                self.turns,
                prompt_builder,
                self.phases,
                frozen=frozen_seats,
                snapshots=snapshot_engines,
            )
            if settings.custom_env.seats
            else None
        )

    @property
    def progress(self) -> EnvProgress:
        """What the env is doing now, for the watchdog."""
        return self.phases.progress

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
                    self.phases.set_phase("waiting_for_episode")
                    requested_at = time.time()
                    spec = await self.scheduler.next_episode(self.env_id)
                    if spec is None:
                        break
                trajectory = await self._play(spec, requested_at)
                spec = None
                if trajectory is None:
                    continue
                if hand_over_and_next is None or self._stopping:
                    self.phases.set_phase("handing_over")
                    await self.scheduler.put_trajectory(trajectory)
                    continue
                # The hand-over is an in-memory append; the call then waits for a seat like next_episode.
                self.phases.set_phase("waiting_for_episode")
                requested_at = time.time()
                spec = await hand_over_and_next(trajectory)
                if spec is None:
                    break
        finally:
            self.phases.set_phase("stopped")
            self.env_calls.discard()

    async def _play(
        self, spec: EpisodeSpec, requested_at: float = 0.0
    ) -> Trajectory | None:
        """One episode as its own task, so the scheduler can cancel it without stopping the loop."""
        if self._early_cancels.pop((spec.group_id, spec.episode_id), None) is not None:
            # Cancelled before it reached this env: end it at once, as a cancel in mid-episode would.
            self.stats.cancelled_episodes += 1
            self.stats.cancelled_before_start += 1
            return None
        self.phases.episode = spec
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
            if self._turn_rewards is not None:  # calls of a cancelled or failed episode
                self._turn_rewards.cancel()
                self._turn_rewards = None
            self._episode_task = None
            self.phases.episode = None
            end_episode = getattr(self.engine, "end_episode", None)
            # a Router releases the episode's replica binding
            if end_episode is not None:
                end_episode()

    def cancel_episode(self, group_id: int, episode_id: int) -> bool:
        """Cancel episode (group_id, episode_id); True if it was running and is now cancelled.

        Cancels travel as Ray calls while seats come over ZMQ, so a cancel may arrive before its seat:
        one for an episode that is not the current one is remembered (``EARLY_CANCEL_TTL_S``, at most
        ``EARLY_CANCEL_MAX``) and the episode ends the moment it starts (``cancelled_before_start``).
        """
        current, task = self.phases.episode, self._episode_task
        if (
            current is not None
            and task is not None
            and not task.done()
            and (current.group_id, current.episode_id) == (group_id, episode_id)
        ):
            self._cancel_requested = True
            task.cancel()
            return True
        self._remember_early_cancel((group_id, episode_id))
        return False

    def _remember_early_cancel(self, key: tuple[int, int]) -> None:
        now = self._clock()
        cancels = self._early_cancels
        for old in [k for k, at in cancels.items() if now - at > EARLY_CANCEL_TTL_S]:
            del cancels[old]
        while len(cancels) >= EARLY_CANCEL_MAX:
            del cancels[next(iter(cancels))]  # insertion order: the oldest
        cancels[key] = now

    def stop(self) -> None:
        """Make the loop end; the host cancels the loop task after this."""
        self._stopping = True

    async def wait_closed(self, timeout: float = ENV_CLOSE_TIMEOUT_S) -> None:
        """Wait (bounded) for env closes still running in the background (a remote env's DELETE, a process kill)."""
        await self.env_calls.wait_closed(timeout)

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
        if self._agent_episodes is not None:
            try:
                trajectory = await self._agent_episodes.run(spec, trajectory)
            except AgentEpisodeError as exc:
                return self._fail(trajectory, exc)
            await self._apply_reward(trajectory, question=None, reference=None)
            self.stats.episodes += 1
            return trajectory
        try:
            if self._games is not None:
                trajectory = await self._games.run(spec, trajectory, self._ensure_env)
                self.stats.episodes += 1
                return trajectory
            await self._ensure_env(spec.env_config_override)
            self.phases.set_phase("reset")
            observation, info = await self.env_calls.call("reset", spec.seed)
        except EnvCallError as exc:
            return self._fail(trajectory, exc)

        info = info if isinstance(info, dict) else {}
        note_env_spans(trajectory, info, -1)
        reference = env_reference(info)
        env_tools: EnvTools | None = None
        if info.get("tools"):
            try:
                env_tools = await EnvTools.open(
                    self.prompts, info["tools"], self.tool_parser
                )
            except EnvToolsError as exc:
                return self._fail(trajectory, exc)
        prompts = env_tools.prompts if env_tools is not None else self.prompts
        fields = {
            "instruction": str(info.get("instruction") or ""),
            "observation": self.observations.text(observation),
            "reward": 0.0,
            "turn": 0,
        }
        env_config, tag = self.settings.custom_env, self.settings.tag
        user_texts = [env_config.fill(tag, "instruction_template", fields)]
        turn_rewards = self._start_turn_rewards(trajectory)
        generated_per_turn: list[list[int]] = []
        try:
            first = self.observations.encode(
                prompts.first_turn_ids(user_texts[0]), observation
            )
        except VisionInputError as exc:
            return self._fail(trajectory, exc)
        first = first.fit(seq_len)  # never cuts an image in half
        append_images(trajectory, 0, first)
        append_tokens(trajectory, first.token_ids, generated=False)
        trajectory.prompt_length = len(first.token_ids)

        stop_reason = "max_steps"
        for turn in range(cfg.max_steps):
            budget = seq_len - len(trajectory.token_ids)
            if budget <= 0:
                stop_reason = "max_length"
                break
            generation = await self.turns.generate(
                trajectory, turn, min(cfg.max_tokens_per_step, budget)
            )
            append_tokens(
                trajectory,
                generation.token_ids,
                generated=True,
                logprobs=generation.logprobs,
                versions=generation.token_versions,
            )
            generated_per_turn.append(list(generation.token_ids))
            action_text = self.prompts.decode(generation.token_ids)
            tool_turn = (
                env_tools.turn(generation.token_ids, turn)
                if env_tools is not None
                else None
            )
            record = generation.turn_record(turn, action_text)
            trajectory.turns.append(record)
            note_versions(trajectory, generation.weight_versions)
            sequence_full = len(trajectory.token_ids) >= seq_len
            if sequence_full and generation.finish_reason != "stop":
                stop_reason = "max_length"  # the reply was cut by sequence_length: do not act on half an action
                break

            self.phases.set_phase("env_step", turn)
            started = self._clock()
            record.env_step_started_at = time.time()
            try:
                (
                    observation,
                    reward,
                    terminated,
                    truncated,
                    info,
                ) = await self.env_calls.call(
                    "step", tool_turn.action_text if tool_turn else action_text
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
            record.metrics = numeric_metrics(info)
            note_env_spans(trajectory, info, turn)
            trajectory.episode_reward += record.reward
            if turn_rewards is not None:
                turn_rewards.start(
                    turn,
                    turn_text(
                        trajectory,
                        turn,
                        question=user_texts[turn],
                        first_question=user_texts[0],
                        reference=reference,
                    ),
                )

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
            user_texts.append(env_config.fill(tag, "observation_template", fields))
            if env_tools is not None and tool_turn is not None:
                delta_ids = env_tools.delta_ids(
                    generation.token_ids, tool_turn, record.observation, user_texts[-1]
                )
            else:
                delta_ids = self.prompts.closure_ids_after(
                    generation.token_ids
                ) + self.prompts.user_delta_ids(user_texts[-1])
            try:
                delta = self.observations.encode(delta_ids, observation)
            except VisionInputError as exc:
                return self._fail(trajectory, exc)
            room = seq_len - len(trajectory.token_ids)
            # no room left for even one generated token after this observation
            if len(delta.token_ids) >= room:
                delta = delta.fit(room)  # an image that does not fit whole is left out
                append_images(trajectory, len(trajectory.token_ids), delta)
                append_tokens(trajectory, delta.token_ids, generated=False)
                stop_reason = "max_length"
                break
            append_images(trajectory, len(trajectory.token_ids), delta)
            append_tokens(trajectory, delta.token_ids, generated=False)

        trajectory.stop_reason = stop_reason
        trajectory.metrics = episode_metrics(trajectory.turns)
        if env_tools is not None:
            trajectory.metrics["agent_tool_calls"] = float(env_tools.calls)
            trajectory.metrics["agent_tool_parse_errors"] = float(
                env_tools.parse_errors
            )
        elif self.stats.episodes % PREFIX_CHECK_EVERY_EPISODES == 0:
            check_prefix(self.prompts, trajectory, user_texts, generated_per_turn)
        await self._apply_reward(
            trajectory,
            question=user_texts[0],
            reference=reference,
            turn_rewards=turn_rewards,
        )
        trajectory.finished_at = time.time()
        self.stats.episodes += 1
        return trajectory

    def _start_turn_rewards(self, trajectory: Trajectory) -> TurnRewards | None:
        """This episode's per-turn scorings when its tag's reward has ``per_turn`` (env tags only)."""
        if self.reward_scorer is None or not self.reward_scorer.config.per_turn:
            return None
        self._turn_rewards = TurnRewards(self.reward_scorer, trajectory.traj_id)
        return self._turn_rewards

    async def _apply_reward(
        self,
        trajectory: Trajectory,
        *,
        question: str | None,
        reference: str | None,
        turn_rewards: TurnRewards | None = None,
    ) -> None:
        """The model reward of ``trajectory`` (outcome: the finished episode; per turn: its turns' calls).

        A failed call (timeout, engine error, no score in the reply) is counted in the trajectory's
        metrics and gives zero model reward (to the episode, or to that turn); the episode is handed
        over either way.
        """
        if self.reward_scorer is None:
            return
        self.phases.set_phase("reward")
        if turn_rewards is not None:  # each scored turn carries its own span
            await turn_rewards.apply(trajectory)
            self._turn_rewards = None
            return
        started = time.time()
        outcome = await self.reward_scorer.apply(
            trajectory,
            question=question,
            reference=reference,
            decode=self.prompts.decode,
        )
        if outcome.model_score is not None:  # skipped episodes draw no span
            trajectory.reward_started_at = started
            trajectory.reward_finished_at = time.time()

    def _fail(self, trajectory: Trajectory, exc: BaseException) -> Trajectory:
        trajectory.stop_reason = "env_error"
        trajectory.error = str(exc)
        trajectory.finished_at = time.time()
        self.stats.env_errors += 1
        self.env_calls.mark_dirty()
        logger.warning(
            "env %s (tag %s) episode %s failed: %s",
            self.env_id,
            trajectory.tag,
            trajectory.traj_id,
            exc,
        )
        return trajectory

    async def _ensure_env(self, override: dict[str, Any] | None) -> None:
        """Keep the env if it was built from this episode's config and is still usable; else build one."""
        desired = {**dict(self.settings.custom_env.env_config), **(override or {})}
        await self.env_calls.ensure(desired, lambda: self.phases.set_phase("build_env"))
