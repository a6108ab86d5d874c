"""The per-turn barrier baseline (benchmarks/barrier_rollout.py) against the FAKE engine.

It must differ from the per-env path in scheduling only: same seeds, same
token-in/token-out ids, same trajectory structure. And it must really be a
barrier: no turn-k+1 request before every env finished turn k.
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.barrier_rollout import BarrierRollout
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.metrics import PREFIX_MISMATCH
from roll_async.scheduler.layout import derive_seed
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def make_config(
    tags: dict[str, CustomEnvConfig],
    *,
    num_env_groups: int,
    group_size: int,
    partition=None,
) -> PipelineConfig:
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=num_env_groups * group_size,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs=tags,
        train_env_manager=EnvManagerConfig(
            num_env_groups=num_env_groups,
            group_size=group_size,
            tags=list(tags),
            num_groups_partition=partition or [],
        ),
    )
    validate_config(config)
    return config


def scripted(**env_config) -> CustomEnvConfig:
    return CustomEnvConfig(
        env_type="scripted", env_config=env_config, max_steps=5, max_tokens_per_step=16
    )


def by_key(trajectories):
    return {(t.seed, t.episode_id): t for t in trajectories}


async def test_barrier_trajectories_match_the_per_env_path_token_for_token(tokenizer):
    reply = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    tags = {
        "a": scripted(episode_length=3),
        "b": scripted(episode_length=1, reward="seed_parity"),
    }
    config = make_config(tags, num_env_groups=4, group_size=2, partition=[2, 2])

    per_env_engine = FakeEngine(lambda r: reply, logprob=-0.3)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=per_env_engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    try:
        per_env = await asyncio.wait_for(scheduler.get_batch(step=0), 10)
    finally:
        await scheduler.shutdown()

    barrier_engine = FakeEngine(lambda r: reply, logprob=-0.3)
    barrier = BarrierRollout(
        config,
        engine=barrier_engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    try:
        (round_,) = await asyncio.wait_for(barrier.collect(8), 10)
    finally:
        barrier.close()

    assert len(round_.trajectories) == 8 == len(per_env)
    # Same seeds: group i of a tag plays derive_seed(seed, tag, i) in both.
    expected_seeds = sorted(
        derive_seed(config.seed, tag, i) for tag in ("a", "b") for i in range(2)
    )
    assert sorted({t.seed for t in round_.trajectories}) == expected_seeds
    assert sorted({t.seed for t in per_env}) == expected_seeds
    ours, theirs = by_key(round_.trajectories), by_key(per_env)
    assert ours.keys() == theirs.keys()
    for key, b in ours.items():
        p = theirs[key]
        assert b.token_ids == p.token_ids
        assert b.response_mask == p.response_mask
        assert b.logprobs == p.logprobs
        assert b.prompt_length == p.prompt_length
        assert (b.tag, b.stop_reason, b.num_turns, b.episode_reward) == (
            p.tag,
            p.stop_reason,
            p.num_turns,
            p.episode_reward,
        )
        assert [t.action_text for t in b.turns] == [t.action_text for t in p.turns]
        assert [t.observation for t in b.turns] == [t.observation for t in p.turns]
        # Env metrics agree; the per-env path also samples a template check (rollout/prefix_mismatch_rate).
        assert b.metrics == {k: v for k, v in p.metrics.items() if k != PREFIX_MISMATCH}

    # Same requests: sampling params and stop strings included (ids differ only by their prefix).
    def strip(r):
        return (
            r.prompt_token_ids,
            r.max_tokens,
            r.temperature,
            r.top_p,
            r.top_k,
            r.stop,
            r.logprobs,
        )  # noqa: E731

    assert sorted(map(strip, barrier_engine.requests)) == sorted(
        map(strip, per_env_engine.requests)
    )


async def test_rounds_have_groups_with_shared_seeds_and_fresh_seeds_each_round(
    tokenizer,
):
    config = make_config(
        {"a": scripted(episode_length=2)}, num_env_groups=2, group_size=3
    )
    barrier = BarrierRollout(
        config,
        engine=FakeEngine(tokens_per_request=3),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    try:
        rounds = await asyncio.wait_for(barrier.collect(10), 10)
    finally:
        barrier.close()
    assert len(rounds) == 2 and barrier.num_envs == 6
    seeds = []
    for index, r in enumerate(rounds):
        assert (
            r.started_at <= min(t.finished_at for t in r.trajectories) <= r.finished_at
        )
        groups: dict[int, list] = {}
        for t in r.trajectories:
            groups.setdefault(t.group_id, []).append(t)
            assert (
                t.created_step == index
                and t.stop_reason == "terminated"
                and t.num_turns == 2
            )
        assert len(groups) == 2
        for members in groups.values():
            assert sorted(t.episode_id for t in members) == [0, 1, 2]
            assert len({t.seed for t in members}) == 1
            assert sorted(t.env_id for t in members) == sorted(
                {t.env_id for t in members}
            )
            seeds.append(members[0].seed)
    assert seeds == [derive_seed(config.seed, "a", i) for i in range(4)]


async def test_every_turn_waits_for_all_envs_to_generate_and_step(tokenizer):
    # Env i's step is slow for one env; no turn-1 request may be sent before that slow step ended.
    config = make_config(
        {"a": scripted(episode_length=2, step_latency_s=0.0)},
        num_env_groups=1,
        group_size=4,
    )
    events: list[tuple[str, int]] = []

    def latency(request):
        turn = int(request.request_id.split("-t")[-1].split("-")[0])
        events.append(("request", turn))
        return 0.05 if request.request_id.split("-env")[1].startswith("0-") else 0.0

    def factory(tag, env_config):
        env = scripted_env_factory(tag, env_config)
        original = env.step

        def step(action):
            result = original(action)
            events.append(("step", env._t - 1))
            return result

        env.step = step
        return env

    barrier = BarrierRollout(
        config,
        engine=FakeEngine(tokens_per_request=2, latency_fn=latency),
        tokenizer=tokenizer,
        env_factory=factory,
    )
    try:
        await asyncio.wait_for(barrier.run_round(), 10)
    finally:
        barrier.close()
    first_turn1 = events.index(("request", 1))
    assert sum(1 for e in events[:first_turn1] if e == ("step", 0)) == 4, events
    assert all(e != ("request", 1) for e in events[:first_turn1])
    assert not any(e == ("step", 0) for e in events[first_turn1:])


async def test_longtail_env_runs_through_the_barrier_with_varying_turns(tokenizer):
    tags = {
        "tail": CustomEnvConfig(
            env_type="longtail",
            env_config={
                "min_turns": 1,
                "max_turns": 6,
                "turns_alpha": 0.8,
                "vary_within_group": False,
                "observation_words": 1,
            },
            max_steps=6,
            max_tokens_per_step=8,
            stop=[],
        )
    }
    config = make_config(tags, num_env_groups=8, group_size=2)
    barrier = BarrierRollout(
        config, engine=FakeEngine(tokens_per_request=4), tokenizer=tokenizer
    )
    try:
        (round_,) = await asyncio.wait_for(barrier.collect(16), 10)
    finally:
        barrier.close()
    turns = {t.seed: t.num_turns for t in round_.trajectories}
    assert len(set(turns.values())) > 1  # Pareto draws: episodes differ in length
    assert all(t.stop_reason == "terminated" for t in round_.trajectories)
    assert all(
        t.turns[-1].metrics["target_turns"] == t.num_turns for t in round_.trajectories
    )
