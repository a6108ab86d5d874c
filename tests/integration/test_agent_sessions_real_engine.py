"""Agent sessions against the real CPU engine: agents written only against the real openai client.

The engine calls are recorded between the EnvManager and the real engine actor,
so the checks are on the ids the engine really received and returned.
"""

from __future__ import annotations

import pytest

from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
)
from roll_async.engine.router import RayEngineClient
from roll_async.trajectory import GenerationRequest, GenerationResult

pytestmark = [pytest.mark.integration]

pytest.importorskip("openai")


class RecordingEngine:
    """The real engine actor, with every request and result it handled kept in order."""

    def __init__(self, handle) -> None:
        self.client = RayEngineClient(handle)
        self.calls: list[tuple[GenerationRequest, GenerationResult]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.client.generate(request)
        self.calls.append((request, result))
        return result

    async def abort(self, request_ids: list[str]) -> None:
        await self.client.abort(request_ids)

    async def stats(self) -> dict:
        return await self.client.stats()


def agent_config(agent: str, group_size: int) -> PipelineConfig:
    return PipelineConfig(
        sequence_length=512,
        rollout_batch_size=group_size,
        generation=GenerationConfig(temperature=1.0),
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent=f"roll_async.testing.agents:{agent}",
                max_steps=4,
                max_tokens_per_step=8,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=group_size, tags=["Agent"]
        ),
    )


async def collect(config: PipelineConfig, engine, tokenizer):
    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.scheduler.local import LocalRolloutScheduler

    recording = RecordingEngine(engine)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"), engines=recording, tokenizer=tokenizer
    )
    try:
        batch, metrics = await scheduler.get_batch_with_metrics(0)
    finally:
        await scheduler.shutdown()
    return batch, metrics, recording.calls, scheduler.managers[0].prompts


def calls_of(trajectory, calls):
    return [
        (req, res)
        for req, res in calls
        if trajectory.traj_id in req.request_id and res.finish_reason != "abort"
    ]


async def test_a_three_turn_openai_client_agent_is_token_exact(engine, tokenizer):
    batch, metrics, calls, builder = await collect(
        agent_config("three_turn_agent", group_size=2), engine, tokenizer
    )
    assert len(batch) == 2 and metrics["rollout/agent_segment_breaks"] == 0.0
    for trajectory in batch:
        assert trajectory.stop_reason == "terminated", trajectory.error
        assert trajectory.episode_reward == 1.0 and trajectory.num_turns == 3
        mine = calls_of(trajectory, calls)
        assert len(mine) == 3
        for k in (1, 2):
            (previous, previous_out), (request, _) = mine[k - 1], mine[k]
            head = previous.prompt_token_ids + previous_out.output_token_ids
            assert request.prompt_token_ids[: len(head)] == head, (
                f"call {k} does not extend call {k - 1}'s ids and outputs"
            )
            delta = builder.closure_ids_after(
                previous_out.output_token_ids
            ) + builder.continuation_ids(
                [{"role": "user", "content": f"Feedback {k - 1}: go on."}]
            )
            assert request.prompt_token_ids[len(head) :] == delta
        last_request, last_result = mine[-1]
        assert (
            trajectory.token_ids
            == last_request.prompt_token_ids + last_result.output_token_ids
        )
        generated = [
            t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m
        ]
        assert generated == sum((res.output_token_ids for _, res in mine), [])
        behaviour = [
            lp for lp, m in zip(trajectory.logprobs, trajectory.response_mask) if m
        ]
        assert behaviour == sum((list(res.logprobs) for _, res in mine), []) and all(
            lp <= 0.0 for lp in behaviour
        )
        assert (
            trajectory.oldest_weight_version is not None
            and trajectory.newest_weight_version is not None
        )


async def test_a_history_rewriting_agent_is_counted_not_silently_retokenized(
    engine, tokenizer
):
    batch, metrics, calls, builder = await collect(
        agent_config("history_rewriting_agent", group_size=1), engine, tokenizer
    )
    (trajectory,) = batch
    assert trajectory.stop_reason == "terminated" and trajectory.episode_reward == 0.5
    assert (
        metrics["rollout/agent_segment_breaks"] == 1.0
        and trajectory.metrics["agent_segments"] == 2.0
    )
    (first, first_out), (second, second_out), (third, third_out) = calls_of(
        trajectory, calls
    )
    rewritten = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "(summary of my reply)"},
        {"role": "user", "content": "Continue."},
    ]
    assert second.prompt_token_ids == builder.render_ids(rewritten, True)
    head = first.prompt_token_ids + first_out.output_token_ids
    # the rewrite really left the first segment
    assert second.prompt_token_ids[: len(head)] != head
    assert third.prompt_token_ids[
        : len(second.prompt_token_ids) + len(second_out.output_token_ids)
    ] == (second.prompt_token_ids + second_out.output_token_ids)
    # the last segment, exact
    assert trajectory.token_ids == third.prompt_token_ids + third_out.output_token_ids
    assert trajectory.metrics["agent_dropped_generated_tokens"] == float(
        len(first_out.output_token_ids)
    )


@pytest.mark.slow
async def test_train_runs_three_steps_on_the_worked_example_agent(
    engine, tmp_path, tiny_model_path
):
    import glob
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from roll_async.config.schema import load_config
    from roll_async.pipelines.agentic_pipeline import AgenticPipeline

    repo = Path(__file__).resolve().parents[2]
    config = load_config(
        repo / "configs" / "agent_frozen_lake.yaml",
        [
            f"output_dir={tmp_path}",
            "rollout_batch_size=4",
            "train_env_manager.num_env_groups=2",
            "train_env_manager.group_size=2",
            "trainer.micro_batch_size=4",
            "logging.console=false",
            "eval_steps=0",
            "custom_envs.AgentFrozenLake.max_steps=3",
        ],
    )
    try:
        run = await AgenticPipeline(config, engines=[engine]).run()
    finally:  # give the shared engine the tiny model's own weights back
        version = await engine.get_weight_version.remote()
        await engine.pause.remote("wait")
        await engine.update_weights.remote(
            load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0]), version + 1
        )
        await engine.resume.remote()
    metrics = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    steps = [m for m in metrics if m["step"] >= 0]
    assert [m["step"] for m in steps] == [0, 1, 2]
    assert all(m["train/loss"] is not None for m in steps)
    assert [m["weight_version"] for m in steps] == [
        steps[0]["weight_version"] + i for i in range(3)
    ]
    assert all(
        "rollout/agent_segment_breaks" in m and m["rollout/agent_segment_breaks"] == 0.0
        for m in steps
    )
    trajectories = [
        json.loads(line)
        for line in (run / "trajectories.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(trajectories) == 12 and {t["tag"] for t in trajectories} == {
        "AgentFrozenLake"
    }
    assert all(
        t["stop_reason"] in ("terminated", "max_steps", "max_length")
        for t in trajectories
    )
    assert all(t["turns"] and t["metrics"]["agent_calls"] >= 1 for t in trajectories)
