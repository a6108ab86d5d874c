"""The rollout core against the real vLLM engine, real Ray and the built-in envs.

These are the guarantees the issue names: no barrier between envs, whole groups,
sync pauses and async keeps going within the staleness bound, token-in/token-out
exactness, truncation at sequence_length, contained env timeouts, deterministic
validation, and that every shipped config collects a batch.
"""

from __future__ import annotations

import asyncio
import collections
import glob
import time
from pathlib import Path

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    load_config,
    validate_config,
)
from roll_async.config.validation import trajectories_per_episode
from roll_async.trajectory import GenerationRequest, GenerationResult, Trajectory

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SOKOBAN = {"dim_room": [6, 6], "num_boxes": 1}


def sokoban_env(max_steps: int = 3, max_tokens: int = 16, **delayed) -> CustomEnvConfig:
    if delayed:
        return CustomEnvConfig(
            env_type="delayed",
            env_config={
                "inner_env_type": "sokoban",
                "inner_env_config": SOKOBAN,
                **delayed,
            },
            max_steps=max_steps,
            max_tokens_per_step=max_tokens,
        )
    return CustomEnvConfig(
        env_type="sokoban",
        env_config=SOKOBAN,
        max_steps=max_steps,
        max_tokens_per_step=max_tokens,
    )


def make_config(custom_envs: dict[str, CustomEnvConfig], **fields) -> PipelineConfig:
    manager = fields.pop("train_env_manager")
    config = PipelineConfig(
        custom_envs=custom_envs,
        train_env_manager=manager,
        engine=EngineConfig(max_model_len=1024),
        generation=GenerationConfig(temperature=1.0),
        sequence_length=fields.pop("sequence_length", 768),
        **fields,
    )
    validate_config(config)
    return config


async def run_batches(
    config: PipelineConfig, engine, tokenizer_path, steps: int, between=None
):
    from roll_async.scheduler.rollout_scheduler import RolloutScheduler

    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=str(tokenizer_path),
    )
    batches, metrics = [], []
    try:
        for step in range(steps):
            batch, step_metrics = await scheduler.get_batch_with_metrics(step)
            batches.append(batch)
            metrics.append(step_metrics)
            if between is not None:
                await between(scheduler, step)
    finally:
        await scheduler.shutdown()
    return batches, metrics


def assert_whole_groups(batch: list[Trajectory], group_size: int) -> None:
    groups = collections.defaultdict(list)
    for trajectory in batch:
        groups[trajectory.group_id].append(trajectory)
    for members in groups.values():
        assert len(members) == group_size
        assert (
            len({t.seed for t in members}) == 1 and len({t.tag for t in members}) == 1
        )
        # distinct episodes; after an env error the same (rebuilt) env may replay the re-opened seat
        assert len({t.episode_id for t in members}) == group_size


async def test_no_barrier_fast_envs_finish_several_episodes_while_a_slow_one_plays_one(
    engine, tiny_model_path
):
    config = make_config(
        {
            # 20x: a slow episode lasts long enough for several fast ones even while another
            # test worker's engine shares the two cores (generation then takes seconds).
            "Fast": sokoban_env(step_latency_s=0.2),
            "Slow": sokoban_env(step_latency_s=4.0),
        },
        mode="async",
        max_staleness=3,
        rollout_batch_size=5,
        train_env_manager=EnvManagerConfig(
            num_env_groups=5,
            group_size=1,
            tags=["Fast", "Slow"],
            num_groups_partition=[4, 1],
            max_env_num_per_worker=8,
        ),
    )
    batches, _ = await run_batches(config, engine, tiny_model_path, steps=3)
    trajectories = [t for batch in batches for t in batch]
    slow = min((t for t in trajectories if t.tag == "Slow"), key=lambda t: t.started_at)
    during = [
        t
        for t in trajectories
        if t.tag == "Fast"
        and t.started_at >= slow.started_at
        and t.finished_at <= slow.finished_at
    ]
    per_env = collections.Counter(t.env_id for t in during)
    assert slow.num_turns == 3
    assert len(during) >= 4, (
        f"only {len(during)} fast episodes finished inside one slow episode"
    )
    assert max(per_env.values()) >= 2, (
        f"no fast env finished two episodes while the slow one ran: {per_env}"
    )


async def engine_step_tokens(engine) -> int:
    """Tokens the engine has decoded, counted at each step: a turn still decoding counts (finished requests alone would miss it)."""
    return (await engine.stats.remote())["engine_step_generation_tokens"]


async def tokens_decoded_since(engine, before: int, timeout_s: float = 30.0) -> int:
    """How many tokens the engine decodes past ``before``, waiting up to ``timeout_s`` for the first.

    A loaded machine (the other test worker's engine and trainers share both cores) may take seconds
    per token; env loops that were not running never produce one.
    """
    deadline = time.monotonic() + timeout_s
    while await engine_step_tokens(engine) == before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return await engine_step_tokens(engine) - before


async def test_sync_pauses_the_loops_after_get_batch_and_resume_restarts_them(
    engine, tiny_model_path
):
    config = make_config(
        {"Sokoban": sokoban_env()},
        mode="sync",
        rollout_batch_size=4,
        train_env_manager=EnvManagerConfig(
            num_env_groups=4, group_size=2, tags=["Sokoban"]
        ),
    )

    observations = {}

    async def check_paused(scheduler, step):
        # let the cancelled in-flight turns return (polled: a loaded machine may take seconds)
        deadline = time.monotonic() + 30
        while (await engine.stats.remote())[
            "in_flight"
        ] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # the engine's last step stats are recorded just after its outputs
        await asyncio.sleep(0.5)
        before = await engine_step_tokens(engine)
        await asyncio.sleep(2.0)
        observations["paused_delta"] = await engine_step_tokens(engine) - before
        observations["suspended"] = (await scheduler.describe())["queue"]["suspended"]
        await scheduler.resume()
        observations["resumed_delta"] = await tokens_decoded_since(
            engine, await engine_step_tokens(engine)
        )

    batches, _ = await run_batches(
        config, engine, tiny_model_path, steps=1, between=check_paused
    )
    assert len(batches[0]) == 4
    assert_whole_groups(batches[0], 2)
    assert observations["suspended"] is True
    assert observations["paused_delta"] == 0, (
        "env loops generated while a sync scheduler was suspended"
    )
    assert observations["resumed_delta"] > 0


async def test_async_keeps_generating_within_the_staleness_bound_across_weight_updates(
    engine, tiny_model_path
):
    from safetensors.torch import load_file

    # same values, new version
    weights = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    config = make_config(
        {"Sokoban": sokoban_env(max_tokens=64)},
        mode="async",
        max_staleness=1,
        rollout_batch_size=4,
        train_env_manager=EnvManagerConfig(
            num_env_groups=4, group_size=2, tags=["Sokoban"]
        ),
    )
    versions = []
    generated_during_training = []

    async def train_and_sync(scheduler, step):
        # The "trainer" works for at least 1.2 s while async env loops keep going; the weight update
        # lands while a request of the next step's groups is in flight (polled, so timing cannot hide it).
        deadline = time.monotonic() + 10
        while (await engine.stats.remote())[
            "in_flight"
        ] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        version = await engine.get_weight_version.remote() + 1
        # in-flight turns are aborted and must be continued, not lost
        await engine.pause.remote("abort")
        await engine.update_weights.remote(weights, version)
        before = await engine_step_tokens(engine)
        await engine.resume.remote()
        versions.append(version)
        await asyncio.sleep(1.2)
        generated_during_training.append(await tokens_decoded_since(engine, before))

    batches, metrics = await run_batches(
        config, engine, tiny_model_path, steps=4, between=train_and_sync
    )
    assert all(delta > 0 for delta in generated_during_training), (
        f"tokens generated after each weight update, per step: {generated_during_training}"
    )
    for step, batch in enumerate(batches):
        assert len(batch) == 4
        assert_whole_groups(batch, 2)
        for trajectory in batch:
            assert 0 <= step - trajectory.created_step <= 1
            assert trajectory.oldest_weight_version <= trajectory.newest_weight_version
            assert [t.weight_version for t in trajectory.turns] == sorted(
                t.weight_version for t in trajectory.turns
            )
    later = [t for batch in batches[1:] for t in batch]
    assert any(t.newest_weight_version >= versions[0] for t in later), (
        "no trajectory used the updated weights"
    )
    assert any(
        step - t.created_step == 1 for step, batch in enumerate(batches) for t in batch
    ), (
        "no group generated during training was served: the loops did not overlap with training"
    )
    resumed = sum(
        turn.resumed_generations for batch in batches for t in batch for turn in t.turns
    )
    assert resumed > 0, "no aborted turn was continued across a weight update"
    assert all(m["rollout/staleness/max"] <= 1 for m in metrics)


class RecordingEngine:
    """Passes requests to the real engine actor and keeps every request and result."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.calls: list[tuple[GenerationRequest, GenerationResult]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.handle.generate.remote(request)
        self.calls.append((request, result))
        return result

    async def abort(self, request_ids: list[str]) -> None:
        await self.handle.abort.remote(request_ids)


async def test_token_in_token_out_is_exact_with_the_real_engine(engine, tokenizer):
    from roll_async.scheduler.local import LocalRolloutScheduler

    config = make_config(
        {"Sokoban": sokoban_env(max_steps=3, max_tokens=24)},
        mode="sync",
        rollout_batch_size=4,
        train_env_manager=EnvManagerConfig(
            num_env_groups=2, group_size=2, tags=["Sokoban"]
        ),
    )
    recording = RecordingEngine(engine)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"), engines=recording, tokenizer=tokenizer
    )
    try:
        batch = await scheduler.get_batch(0)
    finally:
        await scheduler.shutdown()
    for trajectory in batch:
        calls = [
            (q, r)
            for q, r in recording.calls
            if q.request_id.split("-env")[0].endswith(trajectory.traj_id)
            and f"-env{trajectory.env_id}-" in q.request_id
        ]
        assert len(calls) == trajectory.num_turns == 3
        ids = trajectory.token_ids
        for k, (request, result) in enumerate(calls):
            prompt = request.prompt_token_ids
            assert ids[: len(prompt)] == prompt, (
                f"turn {k}: prompt is not a prefix of the trajectory"
            )
            out = slice(len(prompt), len(prompt) + len(result.output_token_ids))
            assert ids[out] == result.output_token_ids, (
                f"turn {k}: generated ids were altered"
            )
            assert trajectory.response_mask[out] == [1] * len(result.output_token_ids)
            assert trajectory.logprobs[out] == pytest.approx(result.logprobs)
            if k + 1 < len(calls):
                next_prompt = calls[k + 1][0].prompt_token_ids
                # never re-tokenized
                assert next_prompt[: out.stop] == prompt + result.output_token_ids
        assert sum(trajectory.response_mask) == sum(
            len(r.output_token_ids) for _, r in calls
        )
        assert all(
            lp == 0.0
            for lp, mask in zip(trajectory.logprobs, trajectory.response_mask)
            if mask == 0
        )


async def test_trajectories_are_truncated_at_sequence_length(engine, tiny_model_path):
    config = make_config(
        {"Sokoban": sokoban_env(max_steps=10, max_tokens=48)},
        mode="sync",
        sequence_length=300,
        rollout_batch_size=2,
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["Sokoban"]
        ),
    )
    (batch,), _ = await run_batches(config, engine, tiny_model_path, steps=1)
    for trajectory in batch:
        assert trajectory.stop_reason == "max_length"
        assert len(trajectory.token_ids) == 300
        assert len(trajectory.response_mask) == len(trajectory.logprobs) == 300
        assert trajectory.num_turns < 10


async def test_env_step_timeouts_are_contained_counted_and_refilled(
    engine, tiny_model_path
):
    # Lognormal step latency (median 50 ms, sigma 2.5): roughly one step in five exceeds the 0.5 s timeout.
    config = make_config(
        {
            "Flaky": sokoban_env(
                step_latency_s=0.05, step_latency_sigma=2.5, max_step_latency_s=2.0
            )
        },
        mode="async",
        max_staleness=2,
        rollout_batch_size=4,
        train_env_manager=EnvManagerConfig(
            num_env_groups=4, group_size=2, tags=["Flaky"], env_step_timeout_s=0.5
        ),
    )
    batches, metrics = await run_batches(config, engine, tiny_model_path, steps=3)
    assert sum(m["rollout/env_errors"] for m in metrics) > 0
    for batch in batches:
        assert len(batch) == 4
        assert_whole_groups(batch, 2)
        assert all(t.stop_reason != "env_error" for t in batch)


async def test_redundant_envs_complete_groups_with_the_first_finishers(
    engine, tiny_model_path
):
    config = make_config(
        {"Sokoban": sokoban_env(step_latency_s=0.05, step_latency_sigma=1.5)},
        mode="sync",
        rollout_batch_size=4,
        train_env_manager=EnvManagerConfig(
            num_env_groups=2,
            group_size=2,
            group_size_redundancy=1,
            # this test is about the first-finisher mode (the default, seat_order, is tested on the queue)
            redundancy_keep="first_finished",
            tags=["Sokoban"],
        ),
    )
    batches, metrics = await run_batches(config, engine, tiny_model_path, steps=2)
    for batch in batches:
        assert len(batch) == 4
        assert_whole_groups(batch, 2)
    assert "rollout/cancelled_episodes" in metrics[0]


async def test_validation_is_deterministic(engine, tiny_model_path):
    from roll_async.scheduler.rollout_scheduler import RolloutScheduler
    from roll_async.scheduler.validation import ValidationScheduler

    config = make_config(
        {"Sokoban": sokoban_env()},
        rollout_batch_size=2,
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["Sokoban"]
        ),
        val_env_manager=EnvManagerConfig(
            num_env_groups=3, group_size=1, tags=["Sokoban"]
        ),
    )
    val_spec = rollout_spec(config, "val")
    validation = ValidationScheduler.for_spec(
        val_spec,
        RolloutScheduler(
            val_spec, engine_handles=[engine], tokenizer_path=str(tiny_model_path)
        ),
    )
    try:
        first, first_metrics = await validation.evaluate(0)
        second, second_metrics = await validation.evaluate(1)
    finally:
        await validation.shutdown()
    assert len(first) == 3
    assert [t.seed for t in first] == [t.seed for t in second]
    assert [t.token_ids for t in first] == [t.token_ids for t in second]
    assert (
        first_metrics["val/Sokoban/episode_reward"]
        == second_metrics["val/Sokoban/episode_reward"]
    )


# Vision configs need the vision-language model's engine: the CLI runs in README "Vision-language agents"
# and tests/integration/test_vision_real_engine.py cover them.
SHIPPED = sorted(
    p
    for p in (REPO / "configs").glob("*.yaml")
    if p.name != "base.yaml" and "_vision" not in p.stem
)


#: Configs on another model than the session engine's (tiny-qwen2_5 for tools) are skipped before any
#: engine starts: they roll out and train on their own engine in tests/integration/test_tool_configs_train.py.
OTHER_MODEL = pytest.mark.skip(
    reason="model.path is not the session engine's model; rolled out and trained on its own engine "
    "in tests/integration/test_tool_configs_train.py"
)


def _shipped_param(path: Path):
    on_session_model = load_config(path).model.path in (None, "tiny")
    return pytest.param(
        path, id=path.stem, marks=() if on_session_model else OTHER_MODEL
    )


@pytest.mark.parametrize("path", [_shipped_param(p) for p in SHIPPED])
async def test_every_shipped_config_collects_a_batch(path, engine, tiny_model_path):
    base = load_config(path)
    em = base.train_env_manager
    overrides = [
        # a game tag's episode gives one trajectory per policy seat (custom_envs.<Tag>.seats)
        f"rollout_batch_size={em.group_size * len(em.tags) * trajectories_per_episode(base)}",
        f"train_env_manager.num_env_groups={len(em.tags)}",
        "train_env_manager.group_size_redundancy=0",
        "engine.max_model_len=1024",
    ]
    if em.num_groups_partition:
        overrides.append(
            f"train_env_manager.num_groups_partition=[{','.join(['1'] * len(em.tags))}]"
        )
    config = load_config(path, overrides)
    (batch,), (metrics,) = await run_batches(config, engine, tiny_model_path, steps=1)
    assert len(batch) == config.rollout_batch_size
    assert {t.tag for t in batch} == set(em.tags)
    assert metrics["rollout/trajectories_per_s"] > 0
