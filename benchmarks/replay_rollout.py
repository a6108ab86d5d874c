"""Replay a per-env run's engine requests with bare loops: what the engine does with that traffic alone.

The grouping benchmark's ceiling is single-turn (N requests of the mean prompt
and output length, all sent at once). A multi-turn rollout differs from it in
two ways that are not overhead: each turn's prompt extends the last one (the
prefix cache serves most of it) and turns arrive whenever the previous one
ends, mixing prefills into decode steps. ``ReplayRollout`` separates those from
the rollout's own cost. It takes the trajectories a ``per_env`` run produced
and plays them again with ``concurrency`` plain coroutine loops in the driver,
on the same engine client: each loop takes the next recorded episode and, turn
by turn, sends the recorded conversation so far (the prompt ids between the
generated runs of ``response_mask``, followed by what the engine answers in
this replay) with ``max_tokens`` = that turn's recorded length and
``ignore_eos``. There are no envs, no tokenizer, no scheduler and no worker
processes: only the per-env request pattern, with the same prompt growth,
prefix-cache reuse, lengths and concurrency.

So, on one engine and side by side: per_env ÷ replay is what the rollout
machinery costs (on a machine where it shares CPU with the model, that is its
CPU); replay ÷ ceiling is what the multi-turn request pattern itself costs or
gains. Env latency is not replayed: use it on workloads without env latency
(``zero_latency``), where per-env should sit at replay's throughput.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from roll_async.engine.router import EngineClient
from roll_async.env_managers.trajectory_bookkeeping import append_tokens
from roll_async.trajectory import GenerationRequest, Trajectory, TurnRecord


@dataclass(frozen=True)
class ReplayTurn:
    """One recorded turn: the prompt ids added before it (the first turn: the whole first prompt) and its output length."""

    prompt_delta: tuple[int, ...]
    output_len: int


def replay_script(trajectory: Trajectory) -> list[ReplayTurn]:
    """The turns of a recorded trajectory, split at the generated runs of its response mask.

    Prompt ids after the last generated run (an observation that ended the episode by length) are dropped:
    no request carried them.
    """
    turns: list[ReplayTurn] = []
    ids, mask = trajectory.token_ids, trajectory.response_mask
    i, n, pending = 0, len(mask), []
    while i < n:
        if not mask[i]:
            pending.append(ids[i])
            i += 1
            continue
        start = i
        while i < n and mask[i]:
            i += 1
        turns.append(ReplayTurn(tuple(pending), i - start))
        pending = []
    return turns


class ReplayRollout:
    """Plays recorded episodes through ``engine`` with ``concurrency`` loops; returns one Trajectory per episode."""

    def __init__(
        self,
        engine: EngineClient,
        *,
        concurrency: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(
                f"ReplayRollout: concurrency must be >= 1, got {concurrency}"
            )
        self.engine = engine
        self.concurrency = concurrency
        self.temperature = temperature
        self.top_p = top_p

    async def replay(self, recorded: Sequence[Trajectory]) -> list[Trajectory]:
        scripts = iter(
            [(t, replay_script(t)) for t in recorded if t.response_length > 0]
        )
        loops = [
            self._loop(scripts) for _ in range(min(self.concurrency, len(recorded)))
        ]
        return [t for batch in await asyncio.gather(*loops) for t in batch]

    async def _loop(
        self, scripts: Iterator[tuple[Trajectory, list[ReplayTurn]]]
    ) -> list[Trajectory]:
        played: list[Trajectory] = []
        for (
            original,
            script,
            # one shared iterator: each loop takes the next episode when it is free
        ) in scripts:
            played.append(await self._play(original, script))
        return played

    async def _play(self, original: Trajectory, script: list[ReplayTurn]) -> Trajectory:
        trajectory = Trajectory(
            tag=original.tag,
            group_id=original.group_id,
            episode_id=original.episode_id,
            env_id=original.env_id,
            seed=original.seed,
            traj_id=f"replay-{original.traj_id}",
            created_step=original.created_step,
            started_at=time.time(),
        )
        for turn, step in enumerate(script):
            append_tokens(trajectory, list(step.prompt_delta), generated=False)
            if turn == 0:
                trajectory.prompt_length = len(step.prompt_delta)
            started = time.perf_counter()
            result = await self.engine.generate(
                GenerationRequest(
                    request_id=f"replay-{uuid.uuid4().hex[:12]}",
                    prompt_token_ids=list(trajectory.token_ids),
                    max_tokens=step.output_len,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    ignore_eos=True,
                    logprobs=True,  # as the rollout asks: the engine's per-token work is the same
                )
            )
            output = list(result.output_token_ids)
            append_tokens(
                trajectory, output, generated=True, logprobs=list(result.logprobs)
            )
            trajectory.turns.append(
                TurnRecord(
                    turn=turn,
                    action_text="",
                    observation="",
                    reward=0.0,
                    generated_tokens=len(output),
                    weight_version=result.weight_version,
                    generate_s=time.perf_counter() - started,
                    env_step_s=0.0,
                    finish_reason=result.finish_reason,
                )
            )
        trajectory.stop_reason = original.stop_reason
        trajectory.finished_at = time.time()
        return trajectory
