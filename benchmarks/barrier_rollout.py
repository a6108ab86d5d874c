"""The per-turn barrier baseline: how NeMo-RL's synchronous multi-turn rollout, RAGEN and legacy VAGEN schedule.

A *round* plays one episode on every env instance. All envs reset together;
then every turn is two barriers: all active envs generate (their requests go to
the engine together, and the turn waits for the slowest reply), then all active
envs step (in parallel threads, and the turn waits for the slowest step). Envs
whose episode ended sit idle until the whole round is over; the next round
starts only then. That is NeMo-RL's ``run_multi_turn_rollout`` loop (generate
for the active batch, step the active envs, repeat until none is active), the
RAGEN/VAGEN ``EnvStateManager`` loop, and ROLL's synchronous env manager.

Everything except the scheduling is the per-env path's own: the same env
classes and configs (built through the same factory), the same group layout and
seeds (``env_layout`` and ``derive_seed``: group ``i`` of a tag plays the same
seed as the per-env scheduler's group ``i``), the same ``ChatPromptBuilder``
token-in/token-out prompts, templates, stop strings, ``max_tokens`` budget and
stop reasons (the turn logic mirrors ``EnvManager._run_episode`` and reuses its
helpers, ``env_managers.trajectory_bookkeeping``; a unit test checks both produce identical token ids), and the same
engine object or Ray handle. It produces the project's ``Trajectory`` type.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from roll_async.config.schema import CustomEnvConfig, PipelineConfig
from roll_async.engine.router import EngineClient
from roll_async.env_managers.trajectory_bookkeeping import (
    append_tokens,
    episode_metrics,
    note_versions,
    numeric_metrics,
)
from roll_async.env_managers.turn_generator import append_generation
from roll_async.env_managers.worker import EnvFactory, RegisteredEnvFactory
from roll_async.prompts.images import observation_text
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.scheduler.layout import derive_seed, env_layout
from roll_async.trajectory import GenerationRequest, Trajectory, TurnRecord


@dataclass
class RoundResult:
    """One barrier round: every env's trajectory, and when the round started and ended (``time.time()``)."""

    trajectories: list[Trajectory]
    started_at: float
    finished_at: float
    turns: int = 0


@dataclass
class _Episode:
    """One env's episode inside a round: the same turn logic as ``EnvManager._run_episode``, split at the barriers."""

    env_id: int
    tag: str
    cfg: CustomEnvConfig
    prompts: ChatPromptBuilder
    sequence_length: int
    trajectory: Trajectory
    fields: dict[str, Any] = field(default_factory=dict)
    turn: int = 0
    done: bool = False
    last_ids: list[int] = field(default_factory=list)

    def render(self, template_name: str) -> str:
        return getattr(self.cfg, template_name).format(**self.fields)

    def begin(self, observation: Any, info: Any) -> None:
        info = info if isinstance(info, dict) else {}
        self.fields = {
            "instruction": str(info.get("instruction") or ""),
            "observation": observation_text(observation),
            "reward": 0.0,
            "turn": 0,
        }
        prompt = self.prompts.first_turn_ids(self.render("instruction_template"))[
            : self.sequence_length
        ]
        append_tokens(self.trajectory, prompt, generated=False)
        self.trajectory.prompt_length = len(prompt)
        if self.cfg.max_steps < 1:
            self.finish("max_steps")

    def max_new_tokens(self) -> int:
        """Tokens this turn may generate; ends the episode (max_length) when there is no room."""
        budget = self.sequence_length - len(self.trajectory.token_ids)
        if budget <= 0:
            self.finish("max_length")
            return 0
        return min(self.cfg.max_tokens_per_step, budget)

    def after_generation(
        self,
        token_ids: list[int],
        logprobs: list[float],
        finish: str,
        versions: list[int],
        seconds: float,
    ) -> bool:
        """Record the turn's reply; True if the env must step next."""
        t = self.trajectory
        append_tokens(t, token_ids, generated=True, logprobs=logprobs)
        record = TurnRecord(
            turn=self.turn,
            action_text=self.prompts.decode(token_ids),
            observation="",
            reward=0.0,
            generated_tokens=len(token_ids),
            weight_version=versions[-1] if versions else -1,
            generate_s=seconds,
            env_step_s=0.0,
            finish_reason=finish,
        )
        t.turns.append(record)
        note_versions(t, versions)
        self.last_ids = list(token_ids)
        if len(t.token_ids) >= self.sequence_length and finish != "stop":
            self.finish("max_length")
            return False
        return True

    def after_step(self, result: tuple, seconds: float) -> None:
        observation, reward, terminated, truncated, info = result
        t = self.trajectory
        record = t.turns[-1]
        record.env_step_s = seconds
        record.observation = observation_text(observation)
        record.reward = float(reward)
        record.metrics = numeric_metrics(info)
        t.episode_reward += record.reward
        sequence_full = len(t.token_ids) >= self.sequence_length
        if terminated:
            return self.finish("terminated")
        if truncated or self.turn == self.cfg.max_steps - 1:
            return self.finish("max_steps")
        if sequence_full:
            return self.finish("max_length")
        self.fields = {
            **self.fields,
            "observation": record.observation,
            "reward": record.reward,
            "turn": self.turn + 1,
        }
        delta = self.prompts.closure_ids_after(
            self.last_ids
        ) + self.prompts.user_delta_ids(self.render("observation_template"))
        room = self.sequence_length - len(t.token_ids)
        if len(delta) >= room:
            append_tokens(t, delta[:room], generated=False)
            return self.finish("max_length")
        append_tokens(t, delta, generated=False)
        self.turn += 1

    def fail(self, exc: BaseException, seconds: float = 0.0) -> None:
        if self.trajectory.turns:
            self.trajectory.turns[-1].env_step_s = seconds
        self.trajectory.error = f"{type(exc).__name__}: {exc}"
        self.finish("env_error")

    def finish(self, stop_reason: str) -> None:
        t = self.trajectory
        t.stop_reason = stop_reason
        t.metrics = episode_metrics(t.turns)
        t.finished_at = time.time()
        self.done = True


class BarrierRollout:
    """Plays rounds of episodes on all env instances of ``config.train_env_manager`` with per-turn barriers.

    ``engine`` is anything with the engine's async ``generate``/``abort`` (a
    VLLMEngine, a RayEngineClient, a FakeEngine). Sync env calls run in
    ``executor`` (default: one thread per env, so the step phase is as parallel
    as NeMo-RL's env actors).
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        engine: EngineClient,
        tokenizer: Any,
        env_factory: EnvFactory | None = None,
        executor: Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        em = config.train_env_manager
        self.config = config
        self.engine = engine
        self.layout = env_layout(
            em.tags, em.num_env_groups, em.num_groups_partition, em.group_size, 0
        )
        self.group_size = em.group_size
        self._factory = env_factory or RegisteredEnvFactory(config.custom_envs)
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(
            max_workers=max(1, len(self.layout)), thread_name_prefix="barrier-env"
        )
        self._clock = clock
        self._prompts = {
            tag: ChatPromptBuilder(tokenizer, config.custom_envs[tag].system_prompt)
            for tag in em.tags
        }
        self._envs: dict[int, Any] = {}
        self._env_configs: dict[int, dict[str, Any]] = {}
        self._tag_group_count = {tag: 0 for tag in em.tags}
        self._next_group_id = 0
        self._round = 0
        self._request_counter = itertools.count()
        self.request_prefix = f"barrier-{uuid.uuid4().hex[:6]}-"
        self.timeout_s = em.env_step_timeout_s

    @property
    def num_envs(self) -> int:
        return len(self.layout)

    # -- env calls ---------------------------------------------------------------------

    def _inline(self, tag: str) -> bool:
        return self.config.custom_envs[tag].isolation == "inline"

    async def _call(
        self, fn: Callable[..., Any], *args: Any, inline: bool = False
    ) -> Any:
        """``inline``: the tag's ``isolation: inline`` (sync calls on the event loop), as the EnvManagers do."""
        if asyncio.iscoroutinefunction(fn):
            return await asyncio.wait_for(fn(*args), self.timeout_s)
        if inline:
            result = fn(*args)
            return (
                await asyncio.wait_for(result, self.timeout_s)
                if asyncio.iscoroutine(result)
                else result
            )
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        result = await asyncio.wait_for(future, self.timeout_s)
        if asyncio.iscoroutine(result):
            result = await asyncio.wait_for(result, self.timeout_s)
        return result

    async def _reset(self, episode: _Episode) -> None:
        env_id, tag = episode.env_id, episode.tag
        desired = dict(self.config.custom_envs[tag].env_config)
        try:
            if (
                self._envs.get(env_id) is None
                or self._env_configs.get(env_id) != desired
            ):
                self._envs[env_id] = await self._call(
                    self._factory, tag, desired, inline=self._inline(tag)
                )
                self._env_configs[env_id] = desired
            observation, info = await self._call(
                self._envs[env_id].reset,
                episode.trajectory.seed,
                inline=self._inline(tag),
            )
        except Exception as exc:  # noqa: BLE001 - an env failure ends this episode, not the benchmark
            self._envs.pop(env_id, None)
            episode.fail(exc)
            return
        episode.begin(observation, info)

    async def _generate(
        self, episode: _Episode, max_new_tokens: int
    ) -> tuple[list[int], list[float], str, list[int], float]:
        """One turn's generation; like TurnGenerator.generate it continues after an 'abort' finish."""
        gen = self.config.generation
        t = episode.trajectory
        prompt = list(t.token_ids)
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        started = self._clock()
        finish = "length"
        while len(token_ids) < max_new_tokens:
            request = GenerationRequest(
                request_id=f"{self.request_prefix}{t.traj_id}-env{episode.env_id}-t{episode.turn}-r{next(self._request_counter)}",
                prompt_token_ids=prompt + token_ids,
                max_tokens=max_new_tokens - len(token_ids),
                temperature=gen.temperature,
                top_p=gen.top_p,
                top_k=gen.top_k,
                stop=list(episode.cfg.stop),
                logprobs=True,
            )
            result = await asyncio.wait_for(
                self.engine.generate(request), timeout=gen.request_timeout_s
            )
            append_generation(result, token_ids, logprobs, versions)
            if result.finish_reason != "abort":
                finish = result.finish_reason
                break
        return token_ids, logprobs, finish, versions, self._clock() - started

    async def _step(self, episode: _Episode) -> None:
        started = self._clock()
        try:
            result = await self._call(
                self._envs[episode.env_id].step,
                episode.trajectory.turns[-1].action_text,
                inline=self._inline(episode.tag),
            )
        except Exception as exc:  # noqa: BLE001
            self._envs.pop(episode.env_id, None)
            episode.fail(exc, self._clock() - started)
            return
        episode.after_step(result, self._clock() - started)

    # -- rounds ------------------------------------------------------------------------

    def _new_episodes(self) -> list[_Episode]:
        """One episode per env: envs of a tag form groups of group_size in env order; group i plays seed i of the tag."""
        episodes: list[_Episode] = []
        by_tag: dict[str, list[int]] = {}
        for env_id, tag in self.layout:
            by_tag.setdefault(tag, []).append(env_id)
        now = time.time()
        for tag, env_ids in by_tag.items():
            cfg = self.config.custom_envs[tag]
            for start in range(0, len(env_ids), self.group_size):
                index = self._tag_group_count[tag]
                self._tag_group_count[tag] += 1
                group_id = self._next_group_id
                self._next_group_id += 1
                seed = derive_seed(self.config.seed, tag, index)
                for episode_id, env_id in enumerate(
                    env_ids[start : start + self.group_size]
                ):
                    trajectory = Trajectory(
                        tag=tag,
                        group_id=group_id,
                        episode_id=episode_id,
                        env_id=env_id,
                        seed=seed,
                        traj_id=f"{tag}-g{group_id}-e{episode_id}",
                        created_step=self._round,
                        started_at=now,
                    )
                    episodes.append(
                        _Episode(
                            env_id,
                            tag,
                            cfg,
                            self._prompts[tag],
                            self.config.sequence_length,
                            trajectory,
                        )
                    )
        return episodes

    async def run_round(self) -> RoundResult:
        """Play one episode on every env, with a barrier after every generate phase and every step phase."""
        episodes = self._new_episodes()
        started_at = time.time()
        # barrier: all envs reset
        await asyncio.gather(*(self._reset(e) for e in episodes))
        turns = 0
        while True:
            budgets = {id(e): e.max_new_tokens() for e in episodes if not e.done}
            active = [e for e in episodes if not e.done]
            if not active:
                break
            turns += 1
            replies = await asyncio.gather(
                *(self._generate(e, budgets[id(e)]) for e in active)
            )  # barrier: all replies
            stepping = [
                e for e, reply in zip(active, replies) if e.after_generation(*reply)
            ]
            # barrier: all env steps
            await asyncio.gather(*(self._step(e) for e in stepping))
        self._round += 1
        return RoundResult(
            [e.trajectory for e in episodes], started_at, time.time(), turns
        )

    async def collect(self, num_trajectories: int) -> list[RoundResult]:
        """Rounds until at least ``num_trajectories`` trajectories (every env plays one episode per round)."""
        rounds: list[RoundResult] = []
        collected = 0
        while collected < num_trajectories:
            result = await self.run_round()
            rounds.append(result)
            collected += len(result.trajectories)
        return rounds

    def close(self) -> None:
        for env in self._envs.values():
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass
        self._envs.clear()
        if self._own_executor:
            self.executor.shutdown(wait=False, cancel_futures=True)
