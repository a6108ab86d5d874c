"""Agent tags (``custom_envs.<Tag>.agent``) play an episode by running the user's
``async def agent(client, task)`` against the worker's agent gateway instead of
stepping an env; this module runs that episode for the EnvManager and turns the
agent's session into a trajectory, with every model call going through the same
:class:`~roll_async.env_managers.turn_generator.TurnGenerator` as env turns.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from roll_async.agent_gateway.chat_request import Sampling
from roll_async.agent_gateway.server import AgentGateway
from roll_async.agent_gateway.session import AgentSession
from roll_async.agent_gateway.task import (
    AgentFunction,
    AgentTask,
    agent_metrics,
    agent_result,
    load_agent_function,
)
from roll_async.config.schema import CustomEnvConfig, GenerationConfig
from roll_async.env_managers.env_calls import EnvCaller
from roll_async.env_managers.env_status import EnvManagerStats, PhaseReporter
from roll_async.env_managers.trajectory_bookkeeping import note_env_spans
from roll_async.env_managers.turn_generator import TurnGeneration, TurnGenerator
from roll_async.envs.swe.agent_workspace import SweAgentEpisode, agent_swe_config
from roll_async.envs.swe.verifier import VerifierResult
from roll_async.errors import (
    ConfigError,
    EnvCallError,
    LifecycleError,
    RollAsyncError,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trajectory import EpisodeSpec, Trajectory


class AgentEpisodeError(RollAsyncError, RuntimeError):
    """The agent code failed: raised, timed out, returned no reward or made no model call."""


class AgentOutOfTime(AgentEpisodeError):
    """The agent of a workspace episode ran past the task's agent time; the workspace is still scored."""


class AgentEpisodeSettings(Protocol):
    """The tag's settings an agent episode reads (an EnvManagerSettings has them)."""

    tag: str
    custom_env: CustomEnvConfig
    sequence_length: int
    generation: GenerationConfig
    env_step_timeout_s: float


class AgentEpisodeRunner:
    """Plays the agent episodes of one EnvManager.

    Every model call the agent makes goes through an
    :class:`~roll_async.agent_gateway.session.AgentSession` to the EnvManager's
    :class:`TurnGenerator` (retries, continuation after an abort, weight versions:
    the same path as env turns). The agent's return value is the episode reward;
    the session's last segment becomes the trajectory.

    Stop reasons: ``terminated`` (the agent returned); ``max_steps`` /
    ``max_length`` (the session refused a call over ``custom_envs.<Tag>.max_steps``
    or ``sequence_length``). Such an episode is kept truncated, as env episodes
    that reach a limit are: the last segment up to the refused call is token-exact
    and trainable. An agent that catches the refusal (an OpenAI 400 with code
    ``context_length_exceeded`` / ``max_steps_exceeded``) and returns keeps its
    reward and metrics. One that lets it propagate (what agent frameworks do) has
    no return value to keep: its reward is 0 and the episode is flagged
    ``agent_unrewarded_limit`` (``rollout/agent_unrewarded_limits``), so an
    overrun penalty is never silent; a later call that the session serves (the
    agent trimmed its history) clears the limit.
    :meth:`run` raises :class:`AgentEpisodeError` (the caller records an
    ``env_error``) when the agent raised, returned something that is not a reward,
    made no model call, or spent longer than ``env_step_timeout_s`` between model
    calls (its own time, not generation time). An engine failure after retries
    propagates as in any episode.

    Workspace episodes (``env_type: swe`` with ``agent``): the EnvManager's env
    (``env_calls``, built and reset as for a stepped episode) starts the task's
    workspace, and the agent gets a handle to it as ``task.workspace``
    (:mod:`roll_async.envs.swe.agent_workspace`). Commands it runs count as
    activity for ``env_step_timeout_s``; past the task's agent time the agent is
    stopped (``max_steps``, ``agent_out_of_time``). Whenever the agent returned,
    reached a limit or ran out of time, the env's verifier scores the workspace
    and its reward is the episode's (the agent's own is ignored); when the agent
    failed or the episode is cancelled the env is discarded, which closes the
    workspace, as a failed stepped episode's is.
    """

    def __init__(
        self,
        settings: AgentEpisodeSettings,
        *,
        gateway: AgentGateway | None,
        model_name: str,
        prompts: ChatPromptBuilder,
        turns: TurnGenerator,
        tool_parser: str | None = None,
        phases: PhaseReporter,
        stats: EnvManagerStats,
        env_calls: EnvCaller | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        #: The EnvManager's env and its calls: workspace episodes start and verify their task there.
        self.env_calls = env_calls
        self.gateway = gateway
        self.model_name = model_name
        self.prompts = prompts
        self.turns = turns
        #: ``model.tool_parser``: the vLLM tool parser for replies to requests with tools (None: detected).
        self.tool_parser = tool_parser
        self.phases = phases
        self.stats = stats
        self._clock = clock

    async def run(self, spec: EpisodeSpec, trajectory: Trajectory) -> Trajectory:
        """Play ``spec`` into ``trajectory``; on AgentEpisodeError the trajectory holds what was played."""
        settings = self.settings
        cfg = settings.custom_env
        gateway = self.gateway
        if gateway is None:
            raise LifecycleError(
                f"custom_envs.{settings.tag}.agent is set but this EnvManager has no agent gateway"
            )
        agent_fn = load_agent_function(
            cfg.agent_function or "", f"custom_envs.{settings.tag}.agent"
        )
        await gateway.ensure_started()
        workspace = await self._start_workspace(spec) if cfg.drives_workspace else None
        scored = False
        try:
            played = await self._play(spec, trajectory, gateway, agent_fn, workspace)
            scored = True
            return played
        finally:
            if workspace is not None and not scored:
                # the agent failed, the verifier did, or the episode was cancelled: the env's state is
                # unknown, and discarding it closes its workspace (in the background, with no await
                # here, so a cancellation cannot skip it)
                workspace.stop()
                self._discard_env()

    async def _play(
        self,
        spec: EpisodeSpec,
        trajectory: Trajectory,
        gateway: AgentGateway,
        agent_fn: AgentFunction,
        workspace: SweAgentEpisode | None,
    ) -> Trajectory:
        settings = self.settings
        cfg = settings.custom_env

        sampling_overrides = 0
        unrewarded_limit = 0.0

        async def generate(
            prompt: list[int], max_tokens: int, sampling: Sampling, call: int
        ) -> TurnGeneration:
            nonlocal sampling_overrides
            training_sampling, overridden = _training_sampling(
                sampling, settings.generation
            )
            sampling_overrides += overridden
            return await self.turns.generate(
                trajectory,
                call,
                max_tokens,
                prompt_ids=prompt,
                sampling=training_sampling,
            )

        session = AgentSession(
            uuid.uuid4().hex[:12],
            self.prompts,
            generate,
            model_name=self.model_name,
            max_tokens_per_step=cfg.max_tokens_per_step,
            sequence_length=settings.sequence_length,
            max_calls=cfg.max_steps,
            tool_parser=self.tool_parser,
        )
        base_url = gateway.open_session(session)
        import openai  # optional dependency (the ``envs`` extra), needed by agent tags only

        client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key="roll-async-local",
            max_retries=0,
            timeout=settings.generation.request_timeout_s * 2,
        )
        task = AgentTask(
            seed=spec.seed,
            env_config={**dict(cfg.env_config), **(spec.env_config_override or {})},
            tag=spec.tag,
            env_type=cfg.env_type,
            group_id=spec.group_id,
            episode_id=spec.episode_id,
            model=session.model_name,
            max_tokens=cfg.max_tokens_per_step,
            max_steps=cfg.max_steps,
            workspace=workspace.handle if workspace is not None else None,
        )
        self.phases.set_phase("env_step", 0)
        agent_task = asyncio.create_task(
            agent_fn(client, task), name=f"agent-{trajectory.traj_id}"
        )
        out_of_time = 0.0
        try:
            value = await self._await_agent(
                agent_task, session, settings.env_step_timeout_s, workspace
            )
            if session.engine_error is not None:
                raise session.engine_error
            reward, metrics = (
                agent_result(value)
                if workspace is None
                else (0.0, agent_metrics(value))
            )
            stop_reason = session.limit_reason or "terminated"
        except AgentOutOfTime:
            if session.engine_error is not None:
                raise session.engine_error from None
            reward, metrics, stop_reason, out_of_time = 0.0, {}, "max_steps", 1.0
        except AgentEpisodeError:
            if session.engine_error is not None:
                raise session.engine_error from None
            if session.limit_reason is None or not session.segments:
                _fill(trajectory, session)
                raise
            reward, metrics, stop_reason = 0.0, {}, session.limit_reason
            # a workspace episode is scored by its verifier whatever the agent returned
            unrewarded_limit = 1.0 if workspace is None else 0.0
        except ValueError as exc:  # agent_result: not a reward
            _fill(trajectory, session)
            raise AgentEpisodeError(str(exc)) from exc
        finally:
            if not agent_task.done():
                agent_task.cancel()
                await asyncio.gather(agent_task, return_exceptions=True)
            gateway.close_session(session.session_id)
            await client.close()
        if not session.segments:
            raise AgentEpisodeError(
                "the agent made no model call; there is nothing to train on"
            )
        if workspace is not None:
            verdict = await self._verify(workspace)
            reward = verdict.reward
            metrics = {
                **metrics,
                **workspace.metrics(verdict),
                "agent_out_of_time": out_of_time,
            }
        _fill(trajectory, session)
        if (
            workspace is not None
        ):  # its timeline (start, commands, verify), as a stepped episode's
            note_env_spans(trajectory, {"env_spans": workspace.spans}, -1)
        trajectory.episode_reward = reward
        trajectory.turns[-1].reward = reward
        trajectory.stop_reason = stop_reason
        trajectory.metrics = {
            **_session_metrics(session),
            "agent_sampling_overrides": float(sampling_overrides),
            "agent_unrewarded_limit": unrewarded_limit,
            **metrics,
        }
        trajectory.finished_at = time.time()
        return trajectory

    async def _start_workspace(self, spec: EpisodeSpec) -> SweAgentEpisode:
        """Build (or keep) the episode's env and reset it, as a stepped episode's: the task's workspace, and its handle."""
        tag = self.settings.tag
        if self.env_calls is None:
            raise LifecycleError(
                f"custom_envs.{tag}.agent drives an env's workspace but this runner has no env to start it"
            )
        env_config = {
            **dict(self.settings.custom_env.env_config),
            **(spec.env_config_override or {}),
        }
        try:
            agent_swe_config(env_config, f"custom_envs.{tag}.env_config")
            await self.env_calls.ensure(
                env_config, lambda: self.phases.set_phase("build_env")
            )
            self.phases.set_phase("reset")
            await self.env_calls.call("reset", spec.seed)
            return SweAgentEpisode(self.env_calls.env, self._clock)
        except (ConfigError, EnvCallError, LifecycleError) as exc:
            self._discard_env()
            raise AgentEpisodeError(
                f"the task's workspace did not start: {exc}"
            ) from exc
        except BaseException:  # cancelled while starting: a workspace may be up
            self._discard_env()
            raise

    def _discard_env(self) -> None:
        """Drop the episode's env (its close, in the background, closes the workspace); rebuilt next episode."""
        if self.env_calls is not None:
            self.env_calls.mark_dirty()
            self.env_calls.discard()

    async def _verify(self, workspace: SweAgentEpisode) -> VerifierResult:
        """Stop the handle's commands, then the env's verifier scores the workspace and closes it."""
        await workspace.close()
        assert self.env_calls is not None
        self.phases.set_phase("env_step")
        began = time.time()
        try:
            verdict: VerifierResult = await self.env_calls.call("verify")
        except EnvCallError as exc:
            raise AgentEpisodeError(f"verifying the workspace failed: {exc}") from exc
        finally:
            workspace.note_span("verify", began)
        return verdict

    async def _await_agent(
        self,
        agent_task: asyncio.Task[object],
        session: AgentSession,
        timeout_s: float,
        workspace: SweAgentEpisode | None = None,
    ) -> Any:
        """The agent's return value; AgentEpisodeError when it raises or idles over ``timeout_s`` between model
        calls (a workspace's commands count as activity), AgentOutOfTime past a workspace's agent deadline."""
        clock = self._clock
        deadline = (
            clock() + (workspace.deadline - time.monotonic())
            if workspace is not None
            else None
        )

        def idle_for() -> float:
            if session.busy or (workspace is not None and workspace.busy):
                return 0.0
            last = session.last_activity
            if workspace is not None:
                last = max(last, workspace.last_activity)
            return clock() - last

        while True:
            wait = timeout_s - idle_for()
            if deadline is not None:
                wait = min(wait, deadline - clock())
            done, _ = await asyncio.wait({agent_task}, timeout=max(0.01, wait))
            if done:
                break
            if deadline is not None and clock() >= deadline:
                agent_task.cancel()
                await asyncio.gather(agent_task, return_exceptions=True)
                raise AgentOutOfTime("the agent ran past the task's agent time")
            if idle_for() >= timeout_s:
                agent_task.cancel()
                await asyncio.gather(agent_task, return_exceptions=True)
                self.stats.env_timeouts += 1
                raise AgentEpisodeError(
                    f"agent code exceeded env_step_timeout_s={timeout_s}s without a model call"
                )
        if agent_task.cancelled():
            raise AgentEpisodeError("the agent task was cancelled")
        exc = agent_task.exception()
        if exc is not None:
            raise AgentEpisodeError(
                f"agent raised {type(exc).__name__}: {exc}"
            ) from exc
        return agent_task.result()


def _fill(trajectory: Trajectory, session: AgentSession) -> Trajectory:
    """Copy the last segment into the trajectory (the part trained on)."""
    if not session.segments:
        return trajectory
    last = session.segments[-1]
    trajectory.token_ids = list(last.token_ids)
    trajectory.response_mask = list(last.response_mask)
    trajectory.logprobs = list(last.logprobs)
    trajectory.token_versions = list(last.token_versions)
    trajectory.prompt_length = last.prompt_length
    trajectory.turns = list(last.turns)
    versions = last.weight_versions
    trajectory.oldest_weight_version = min(versions) if versions else None
    trajectory.newest_weight_version = max(versions) if versions else None
    return trajectory


def _training_sampling(
    requested: Sampling, generation: GenerationConfig
) -> tuple[Sampling, bool]:
    """The request's sampling with temperature / top_p / top_k set to ``generation.*``; True if that changed them.

    The trainer scores every batch under ``generation.*`` (roll_async.sampling), so the behaviour
    logprobs must come from that distribution: an agent's own temperature would make the importance
    ratios wrong without any sign. Stop strings and seed do not change the distribution and are kept.
    """
    asked = (requested.temperature, requested.top_p, requested.top_k)
    trained = (generation.temperature, generation.top_p, generation.top_k)
    overridden = any(
        value is not None and value != train for value, train in zip(asked, trained)
    )
    return Sampling(stop=list(requested.stop), seed=requested.seed), overridden


def _session_metrics(session: AgentSession) -> dict[str, float]:
    dropped = sum(s.generated_tokens for s in session.segments[:-1])
    return {
        "agent_calls": float(session.calls),
        "agent_segments": float(len(session.segments)),
        "agent_segment_breaks": float(session.segment_breaks),
        "agent_dropped_generated_tokens": float(dropped),
        "agent_echoes_by_meaning": float(session.echoes_by_meaning),
        "agent_tool_calls": float(session.tool_calls),
        "agent_tool_parse_errors": float(session.tool_parse_errors),
        "agent_tool_choice_unmet": float(session.tool_choice_unmet),
    }
