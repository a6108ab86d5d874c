"""EnvManager behaviour end to end in one process: scripted envs, FakeEngine, real GroupQueueManager."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.env_managers.worker import EnvManagerHost, find_stalled
from roll_async.errors import RolloutFatalError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import FailurePlan, scripted_env_factory
from roll_async.trajectory import Trajectory


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


@pytest.fixture(scope="module")
def answer_ids(tokenizer) -> list[int]:
    """A reply ending in EOS, as a model would emit it."""
    return tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]


def make_config(
    *,
    env_config: dict | None = None,
    tags: dict[str, dict] | None = None,
    partition: list[int] | None = None,
    num_env_groups: int = 1,
    group_size: int = 1,
    redundancy: int = 0,
    batch_size: int | None = None,
    mode: str = "sync",
    max_staleness: int | None = None,
    sequence_length: int = 512,
    max_steps: int = 5,
    max_tokens_per_step: int = 16,
    env_step_timeout_s: float = 5.0,
    generation: GenerationConfig | None = None,
    group_filter: str = "none",
) -> PipelineConfig:
    tags = tags or {"count": env_config or {"episode_length": 3}}
    config = PipelineConfig(
        mode=mode,
        max_staleness=max_staleness,
        rollout_batch_size=batch_size or num_env_groups * group_size,
        sequence_length=sequence_length,
        generation=generation or GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            tag: CustomEnvConfig(
                env_type="scripted",
                env_config=cfg,
                max_steps=max_steps,
                max_tokens_per_step=max_tokens_per_step,
            )
            for tag, cfg in tags.items()
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=num_env_groups,
            group_size=group_size,
            group_size_redundancy=redundancy,
            tags=list(tags),
            num_groups_partition=partition or [],
            env_step_timeout_s=env_step_timeout_s,
            group_filter=group_filter,
        ),
    )
    validate_config(config)
    return config


def local(config, engine, tokenizer, **kwargs) -> LocalRolloutScheduler:
    return LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
        **kwargs,
    )


async def test_no_barrier_fast_envs_finish_several_episodes_while_a_slow_one_is_mid_episode(
    tokenizer, answer_ids
):
    config = make_config(
        tags={
            "fast": {"episode_length": 3, "step_latency_s": 0.01},
            "slow": {"episode_length": 3, "step_latency_s": 0.1},
        },
        partition=[1, 1],
        num_env_groups=2,
        batch_size=8,
        mode="async",
        max_staleness=4,
    )
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    finished_at: list[tuple[str, float]] = []
    real_put = scheduler.group_queue.put_trajectory

    async def recording_put(trajectory):
        finished_at.append((trajectory.tag, time.monotonic()))
        await real_put(trajectory)

    scheduler.group_queue.put_trajectory = recording_put  # type: ignore[method-assign]
    await scheduler.start()
    try:
        while not any(tag == "slow" for tag, _ in finished_at):
            await asyncio.sleep(0.01)
        first_slow = next(t for tag, t in finished_at if tag == "slow")
        fast_before = sum(
            1 for tag, t in finished_at if tag == "fast" and t < first_slow
        )
        assert fast_before >= 4, (
            f"fast env finished only {fast_before} episodes during the slow env's first one"
        )
    finally:
        await scheduler.shutdown()


async def test_token_in_token_out_is_exact(tokenizer):
    # Single-byte tokens that re-tokenization would merge differently: any re-encoding shows up.
    reply = [tokenizer.convert_tokens_to_ids(c) for c in "<answer>Up</answer>"] + [
        tokenizer.eos_token_id
    ]
    assert (
        reply[:-1]
        != tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"]
    )
    engine = FakeEngine(lambda r: reply, logprob=-0.25)
    config = make_config(env_config={"episode_length": 3}, max_tokens_per_step=32)
    scheduler = local(config, engine, tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    builder = ChatPromptBuilder(tokenizer, config.custom_envs["count"].system_prompt)
    prompts = [r.prompt_token_ids for r in engine.requests]
    assert len(prompts) == 3
    assert prompts[0] == builder.first_turn_ids(
        f"Count up.\n{trajectory.turns[0].observation.replace('t1', 't0')}"
    )
    for k in range(1, 3):
        delta = builder.closure_ids_after(reply) + builder.user_delta_ids(
            trajectory.turns[k - 1].observation
        )
        assert prompts[k] == prompts[k - 1] + reply + delta, (
            f"turn {k} prompt is not prompt + output + delta"
        )
    assert (
        builder.closure_ids_after(reply)
        == tokenizer("\n", add_special_tokens=False)["input_ids"]
    )
    assert trajectory.token_ids == prompts[-1] + reply
    generated = [i for i, m in enumerate(trajectory.response_mask) if m]
    assert [trajectory.token_ids[i] for i in generated] == reply * 3
    assert all(trajectory.logprobs[i] == -0.25 for i in generated)
    assert sum(trajectory.logprobs) == pytest.approx(-0.25 * len(generated))
    assert trajectory.prompt_length == len(prompts[0])
    assert [t.action_text for t in trajectory.turns] == ["<answer>Up</answer>"] * 3


async def test_reply_without_eos_gets_the_whole_turn_closure(tokenizer):
    # stopped on a stop string
    reply = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"]
    engine = FakeEngine(lambda r: reply)
    scheduler = local(make_config(env_config={"episode_length": 2}), engine, tokenizer)
    try:
        await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    first, second = (r.prompt_token_ids for r in engine.requests)
    closure = tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert (
        second[len(first) : len(first) + len(reply) + len(closure)] == reply + closure
    )


async def test_requests_respect_the_sequence_length_and_the_episode_ends_at_max_length(
    tokenizer,
):
    # never stops by itself: every turn ends by "length"
    engine = FakeEngine(lambda r: [7] * 100)
    probe = ChatPromptBuilder(tokenizer, CustomEnvConfig(env_type="x").system_prompt)
    first_prompt = len(probe.first_turn_ids("Count up.\ns0t0 s0t0"))
    sequence_length = first_prompt + 40
    config = make_config(
        env_config={"episode_length": 50},
        sequence_length=sequence_length,
        max_steps=50,
        max_tokens_per_step=16,
    )
    scheduler = local(config, engine, tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    lengths = [len(r.prompt_token_ids) for r in engine.requests]
    for request, length in zip(engine.requests, lengths):
        assert request.max_tokens == min(16, sequence_length - length)
    assert trajectory.stop_reason == "max_length"
    assert len(trajectory.token_ids) == sequence_length
    assert len(trajectory.response_mask) == len(trajectory.logprobs) == sequence_length


async def test_env_reset_and_step_exceptions_are_contained_and_the_group_refilled(
    tokenizer, answer_ids
):
    plan = FailurePlan(reset_failures=2, step_failures=1)
    config = make_config(
        env_config={"episode_length": 2, "failure_plan": plan},
        num_env_groups=2,
        group_size=2,
    )
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 5
        )
    finally:
        await scheduler.shutdown()
    assert len(batch) == 4
    assert all(t.stop_reason == "terminated" for t in batch)
    assert metrics["rollout/env_errors"] == 3
    assert sum(m.stats.env_errors for m in scheduler.managers) == 3
    groups = {}
    for t in batch:
        groups.setdefault(t.group_id, set()).add(t.seed)
    assert all(len(seeds) == 1 for seeds in groups.values()) and all(
        sum(t.group_id == g for t in batch) == 2 for g in groups
    )


@pytest.mark.parametrize("use_async_env", [False, True])
async def test_a_hung_env_step_times_out_and_the_run_continues(
    tokenizer, answer_ids, use_async_env
):
    plan = FailurePlan(step_hangs=1)
    config = make_config(
        env_config={
            "episode_length": 2,
            "failure_plan": plan,
            "hang_s": 0.5,
            "async": use_async_env,
        },
        num_env_groups=2,
        env_step_timeout_s=0.1,
    )
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 5
        )
    finally:
        await scheduler.shutdown()
    assert [t.stop_reason for t in batch] == ["terminated", "terminated"]
    assert metrics["rollout/env_errors"] == 1
    assert sum(m.stats.env_timeouts for m in scheduler.managers) == 1


async def test_inline_isolation_calls_the_env_on_the_event_loop_and_still_counts_an_overrun(
    tokenizer, answer_ids
):
    """isolation: inline: no thread hop; a step that ran past the timeout fails its episode once it returns."""
    import threading

    from roll_async.testing.scripted_envs import ScriptedEnv

    threads: set[int] = set()

    class RecordingEnv(ScriptedEnv):
        def step(self, action_text):
            threads.add(threading.get_ident())
            return super().step(action_text)

    def factory(tag, env_config):
        return RecordingEnv(**env_config)

    config = make_config(
        env_config={
            "episode_length": 2,
            "failure_plan": FailurePlan(step_hangs=1),
            "hang_s": 0.3,
        },
        num_env_groups=2,
        env_step_timeout_s=0.1,
    )
    for spec in config.custom_envs.values():
        spec.isolation = "inline"
    validate_config(config)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(lambda r: answer_ids),
        tokenizer=tokenizer,
        env_factory=factory,
    )
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 10
        )
    finally:
        await scheduler.shutdown()
    assert threads == {
        threading.get_ident()
    }  # every step ran on this (the event loop's) thread
    assert [t.stop_reason for t in batch] == ["terminated", "terminated"]
    assert metrics["rollout/env_errors"] == 1
    assert sum(m.stats.env_timeouts for m in scheduler.managers) == 1


async def test_async_env_methods_are_awaited(tokenizer, answer_ids):
    config = make_config(
        env_config={"episode_length": 2, "async": True, "step_latency_s": 0.01}
    )
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    assert trajectory.stop_reason == "terminated" and trajectory.episode_reward == 2.0
    assert all(turn.env_step_s >= 0.01 for turn in trajectory.turns)


async def test_a_failed_engine_request_is_retried(tokenizer, answer_ids):
    engine = FakeEngine(lambda r: answer_ids, fail_requests=2)
    config = make_config(
        generation=GenerationConfig(max_retries=2, retry_backoff_s=0.001)
    )
    scheduler = local(config, engine, tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    assert trajectory.stop_reason == "terminated"
    assert scheduler.managers[0].stats.engine_retries == 2


@pytest.mark.parametrize(
    "failure, cause",
    [
        ({"fail_requests": 1000}, "FakeEngineError"),
        ({"error_requests": 1000}, "finish reason 'error'"),
    ],
    ids=["raises", "error_finish"],
)
async def test_an_engine_that_keeps_failing_makes_get_batch_raise_naming_env_turn_and_request(
    tokenizer, failure, cause
):
    engine = FakeEngine(**failure)
    config = make_config(
        generation=GenerationConfig(max_retries=1, retry_backoff_s=0.001)
    )
    scheduler = local(config, engine, tokenizer)
    try:
        with pytest.raises(RolloutFatalError) as caught:
            await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    message = str(caught.value)
    assert re.search(
        r"engine request train-\w+-count-g0-e0-env0-t0-r\d+ failed", message
    )
    assert "env 0" in message and "turn 0" in message and "after 2 attempts" in message
    assert cause in message


async def update_mid_turn(tokenizer, pause_mode: str):
    """One 12-token turn with a weight update (version 0 -> 1) in pause mode ``pause_mode`` in the middle."""
    engine = FakeEngine(lambda r: [7] * r.max_tokens, token_latency_s=0.01)
    config = make_config(env_config={"episode_length": 1}, max_tokens_per_step=12)
    scheduler = local(config, engine, tokenizer)
    await scheduler.start()
    try:
        while not engine.requests:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.045)
        await engine.pause(pause_mode)  # as for a weight update
        await asyncio.sleep(0.03)
        await engine.update_weights(None, version=1)
        await engine.resume()
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    return engine, trajectory


async def test_an_aborted_turn_is_continued_from_its_partial_output(tokenizer):
    engine, trajectory = await update_mid_turn(tokenizer, "abort")
    first, second = engine.requests
    partial = second.prompt_token_ids[len(first.prompt_token_ids) :]
    assert 0 < len(partial) < 12 and partial == [7] * len(partial)
    assert second.max_tokens == 12 - len(partial)
    (turn,) = trajectory.turns
    assert turn.generated_tokens == 12 and turn.resumed_generations == 1
    assert (trajectory.oldest_weight_version, trajectory.newest_weight_version) == (
        0,
        1,
    )
    assert (
        sum(trajectory.response_mask)
        == 12
        == len([lp for lp in trajectory.logprobs if lp != 0.0])
    )


class AbortRecordingEngine(FakeEngine):
    """In-process, cancelling the caller already stops a FakeEngine request; record abort calls anyway.

    Env 0's request is answered only once env 1's request is in the engine, so env 1 is always
    mid-generation when env 0 completes the group (not still in reset on a loaded machine).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.abort_calls: list[str] = []
        self._env1_requested = asyncio.Event()

    async def generate(self, request):
        if "-env1-" in request.request_id:
            self._env1_requested.set()
        else:
            await self._env1_requested.wait()
        return await super().generate(request)

    async def abort(self, request_ids):
        self.abort_calls.extend(request_ids)
        await super().abort(request_ids)


async def test_redundant_episode_is_cancelled_and_its_request_aborted(
    tokenizer, answer_ids
):
    def latency(request):  # env 1 is slow, so env 0 completes the group first
        return 1.0 if "-env1-" in request.request_id else 0.0

    engine = AbortRecordingEngine(lambda r: answer_ids, latency_fn=latency)
    config = make_config(env_config={"episode_length": 1}, group_size=1, redundancy=1)
    scheduler = local(config, engine, tokenizer)
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 5
        )
        for _ in range(100):
            if scheduler.managers[1].stats.cancelled_episodes:
                break
            await asyncio.sleep(0.01)
    finally:
        await scheduler.shutdown()
    assert [t.env_id for t in batch] == [0]
    assert metrics["rollout/cancelled_episodes"] == 1
    assert scheduler.managers[1].stats.cancelled_episodes == 1
    assert any("-env1-" in rid for rid in engine.abort_calls)
    assert scheduler.group_queue.counters.late_trajectories == 0


async def test_sync_mode_stops_generation_until_resumed(tokenizer, answer_ids):
    engine = FakeEngine(lambda r: answer_ids, latency_s=0.002)
    config = make_config(
        env_config={"episode_length": 2}, num_env_groups=2, batch_size=1
    )
    scheduler = local(config, engine, tokenizer)
    try:
        await asyncio.wait_for(scheduler.get_batch(step=0), 5)
        seen = len(engine.requests)
        await asyncio.sleep(0.15)
        assert len(engine.requests) == seen, "env loops generated while suspended"
        assert all(
            m.progress.phase == "waiting_for_episode" for m in scheduler.managers
        )
        scheduler.resume()
        await asyncio.sleep(0.05)
        assert len(engine.requests) > seen
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=1), 5)
        assert trajectory.created_step == 1
    finally:
        await scheduler.shutdown()


async def test_async_mode_keeps_generating_and_never_exceeds_max_staleness(
    tokenizer, answer_ids
):
    engine = FakeEngine(lambda r: answer_ids, latency_s=0.002)
    config = make_config(
        env_config={"episode_length": 2},
        num_env_groups=2,
        group_size=2,
        batch_size=2,
        mode="async",
        max_staleness=2,
    )
    scheduler = local(config, engine, tokenizer)
    try:
        for step in range(5):
            batch = await asyncio.wait_for(scheduler.get_batch(step=step), 5)
            for trajectory in batch:
                assert step - trajectory.created_step <= 2
                assert step - trajectory.oldest_weight_version <= 2
            seen = len(engine.requests)
            await asyncio.sleep(0.05)  # "training"
            assert len(engine.requests) > seen or step == 0, (
                "async loops must keep running during training"
            )
            await engine.update_weights(None, version=step + 1)
    finally:
        await scheduler.shutdown()


async def test_episode_ends_at_max_steps_when_the_env_does_not_terminate(
    tokenizer, answer_ids
):
    config = make_config(env_config={"episode_length": 100}, max_steps=3)
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    assert trajectory.stop_reason == "max_steps" and trajectory.num_turns == 3
    assert (
        trajectory.metrics["success"] == 0.0
        and trajectory.metrics["action_is_valid"] == 1.0
    )


async def test_watchdog_reports_an_env_stuck_in_generation(tokenizer, answer_ids):
    engine = FakeEngine(lambda r: answer_ids, latency_s=0.5)
    scheduler = local(make_config(env_config={"episode_length": 1}), engine, tokenizer)
    scheduler.host.watchdog_timeout_s = 0.05
    await scheduler.start()
    try:
        await asyncio.sleep(0.3)
        stalled = scheduler.group_queue.stalled_envs()
        assert list(stalled) == [0] and "generate" in stalled[0]
        await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()


def test_host_watchdog_reports_each_stall_once_and_then_recovery():
    class Manager:
        def __init__(self, env_id, phase, since):
            from roll_async.env_managers.env_status import EnvProgress

            self.env_id = env_id
            self.progress = EnvProgress(phase=phase, last_progress_at=since)
            self.settings = type("S", (), {"tag": "t"})()

    now = [100.0]
    managers = [
        Manager(0, "env_step", 0.0),
        Manager(1, "waiting_for_episode", 0.0),
        Manager(2, "generate", 99.0),
    ]
    host = EnvManagerHost(managers, watchdog_timeout_s=10, clock=lambda: now[0])  # type: ignore[arg-type]
    new, recovered = host.check_watchdog()
    assert sorted(new) == [0, 1] and recovered == []
    assert "waiting_for_episode" in new[1]
    assert host.check_watchdog() == ({}, [])
    managers[0].progress.last_progress_at = 100.0
    assert host.check_watchdog() == ({}, [0])


def test_the_watchdog_covers_every_phase_an_episode_can_stall_in():
    from roll_async.env_managers.env_status import STALL_PHASES, EnvPhase

    phases = set(EnvPhase.__args__)  # type: ignore[attr-defined]
    assert set(STALL_PHASES) == phases - {"idle", "stopped"}

    class Manager:
        def __init__(self, env_id, phase):
            from roll_async.env_managers.env_status import EnvProgress

            self.env_id = env_id
            self.progress = EnvProgress(phase=phase, last_progress_at=0.0)
            self.settings = type("S", (), {"tag": "t"})()

    ordered = sorted(phases)
    managers = [Manager(i, phase) for i, phase in enumerate(ordered)]
    stalled = find_stalled(managers, now=100.0, timeout_s=10.0)  # type: ignore[arg-type]
    assert {ordered[i] for i in stalled} == set(STALL_PHASES)


async def test_the_watchdog_reports_an_env_whose_seat_request_never_comes_back(
    tokenizer,
):
    """A hand-over lost in transport leaves the env in waiting_for_episode, which the watchdog must see."""
    from roll_async.env_managers.worker import build_env_managers

    class LostHandOver:
        async def next_episode(self, env_id):
            await asyncio.Event().wait()  # the answer never arrives

        async def put_trajectory(self, trajectory):
            pass

    stalls: list[tuple[int, str]] = []
    managers = build_env_managers(
        rollout_spec(make_config(), "train"),
        [(0, "count")],
        scheduler=LostHandOver(),
        engine_for=lambda env_id: FakeEngine(lambda r: []),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    host = EnvManagerHost(
        managers,
        watchdog_timeout_s=0.05,
        on_stall=lambda env_id, text: stalls.append((env_id, text)),
    )
    running = asyncio.create_task(host.run())
    try:
        for _ in range(100):
            if stalls:
                break
            await asyncio.sleep(0.02)
    finally:
        await host.stop()
        await asyncio.gather(running, return_exceptions=True)
    assert stalls and stalls[0][0] == 0 and "waiting_for_episode" in stalls[0][1]


async def test_the_queue_counts_a_waiting_env_as_stalled_only_when_it_does_not_hold_its_request():
    """An env the queue keeps waiting for a seat (quota, sync suspension) is not stalled; one whose request
    never reached the queue is."""
    from roll_async.scheduler.group_queue import GroupQueueManager
    from roll_async.scheduler.queue_rules import QueueRules

    queue = GroupQueueManager(
        QueueRules(tags=["a"], group_size=1, groups_per_batch=1),
        env_tags={0: "a", 1: "a", 2: "a"},
    )
    await queue.next_episode(0)  # the only seat
    waiting = asyncio.create_task(
        queue.next_episode(1)
    )  # out of quota: the queue holds it
    await asyncio.sleep(0.01)
    queue.report_stalled(1, "env 1 stuck in waiting_for_episode for 300s")
    queue.report_stalled(2, "env 2 stuck in waiting_for_episode for 300s")
    assert list(queue.stalled_envs()) == [2]
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_a_template_with_an_unknown_field_fails_with_the_key_named(
    tokenizer, answer_ids
):
    config = make_config()
    config.custom_envs["count"].observation_template = "{observation} after {action}"
    scheduler = local(config, FakeEngine(lambda r: answer_ids), tokenizer)
    try:
        with pytest.raises(
            RolloutFatalError, match=r"custom_envs.count.observation_template"
        ):
            await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()


async def test_a_keep_mode_update_mid_turn_gives_one_turn_two_versions_per_token(
    tokenizer,
):
    # keep: the request freezes, keeps its tokens, and continues on the new weights
    engine, trajectory = await update_mid_turn(tokenizer, "keep")
    assert len(engine.requests) == 1, "keep mode continues the same request"
    (turn,) = trajectory.turns
    assert len(trajectory.token_versions) == len(trajectory.token_ids)
    generated = [
        v for v, m in zip(trajectory.token_versions, trajectory.response_mask) if m
    ]
    not_generated = [
        v for v, m in zip(trajectory.token_versions, trajectory.response_mask) if not m
    ]
    old, new = generated.count(0), generated.count(1)
    assert old > 0 and new > 0 and generated == [0] * old + [1] * new
    assert set(not_generated) == {-1}
    assert (
        turn.weight_versions == [0, 1]
        and turn.weight_version == 1
        and turn.resumed_generations == 0
    )
    assert (trajectory.oldest_weight_version, trajectory.newest_weight_version) == (
        0,
        1,
    )


async def test_an_error_finish_is_retried_and_its_partial_output_never_trained_on(
    tokenizer, answer_ids
):
    engine = FakeEngine(lambda r: answer_ids, error_requests=1)
    config = make_config(
        env_config={"episode_length": 1},
        generation=GenerationConfig(max_retries=2, retry_backoff_s=0.001),
    )
    scheduler = local(config, engine, tokenizer)
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    errored, retried = engine.requests[:2]
    assert retried.prompt_token_ids == errored.prompt_token_ids, (
        "the errored piece must not enter the context"
    )
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == answer_ids and trajectory.turns[0].finish_reason == "stop"
    assert scheduler.managers[0].stats.engine_retries == 1


class _QueueActorInProcess:
    """RaySchedulerClient's calls made on a GroupQueueActor object directly (no Ray), counted by method."""

    def __init__(self, actor, incarnation: int = 0) -> None:
        self.actor, self.incarnation, self.calls = actor, incarnation, {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def next_episode(self, env_id):
        self._count("next_episode")
        return await self.actor.next_episode(env_id, self.incarnation)

    async def put_trajectory(self, trajectory):
        self._count("put_trajectory")
        await self.actor.put_trajectory(trajectory)

    async def put_trajectory_and_next_episode(self, trajectory):
        self._count("put_trajectory_and_next_episode")
        return await self.actor.put_trajectory_and_next_episode(
            trajectory, self.incarnation
        )


async def test_a_finished_episode_and_the_next_seat_take_one_scheduler_call(
    tokenizer, answer_ids
):
    """Over Ray each scheduler call is a round trip: after its first episode an env makes one call per episode."""
    from roll_async.env_managers.worker import build_env_managers
    from roll_async.scheduler.layout import env_layout
    from roll_async.scheduler.rollout_scheduler import GroupQueueActor

    config = make_config(num_env_groups=2, group_size=2, mode="async", max_staleness=1)
    actor = GroupQueueActor(rollout_spec(config, "train"), start_step=0)
    client = _QueueActorInProcess(actor)
    em = config.train_env_manager
    managers = build_env_managers(
        rollout_spec(config, "train"),
        env_layout(
            em.tags,
            em.num_env_groups,
            em.num_groups_partition,
            em.group_size,
            em.group_size_redundancy,
        ),
        scheduler=client,
        engine_for=lambda env_id: FakeEngine(lambda r: answer_ids),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    host = EnvManagerHost(managers)
    running = asyncio.create_task(host.run())
    try:
        served = [await actor.get_batch(step) for step in range(3)]
        assert [len(batch.trajectories) for batch in served] == [4, 4, 4]
        assert all(
            t.stop_reason == "terminated"
            for batch in served
            for t in batch.trajectories
        )
    finally:
        await actor.shutdown()
        await asyncio.wait_for(running, timeout=10)
    handed_over = client.calls["put_trajectory_and_next_episode"]
    # every served trajectory came back through the combined call
    assert handed_over >= 12
    # the first seat of each env only
    assert client.calls["next_episode"] == len(managers)
    assert "put_trajectory" not in client.calls


async def test_the_combined_call_from_a_dead_worker_incarnation_gives_its_seat_back(
    tokenizer, answer_ids
):
    """The seat handed to a replaced worker's late call goes back to the queue (as next_episode does)."""
    from roll_async.scheduler.rollout_scheduler import GroupQueueActor

    config = make_config(num_env_groups=1, group_size=1, mode="async", max_staleness=1)
    actor = GroupQueueActor(rollout_spec(config, "train"), start_step=0)
    spec = await actor.next_episode(0, 0)
    await actor.restart_envs(
        [0], "worker died", incarnation=1
    )  # the episode of spec is lost to the restart (its seat re-opens)
    finished = Trajectory(
        tag=spec.tag,
        group_id=spec.group_id,
        episode_id=spec.episode_id,
        env_id=0,
        seed=spec.seed,
        traj_id="late",
        created_step=spec.created_step,
        stop_reason="terminated",
    )
    assert await actor.put_trajectory_and_next_episode(finished, 0) is None
    fresh = await asyncio.wait_for(actor.next_episode(0, 1), timeout=5)
    # the seat the old incarnation was given is playable by the new one
    assert fresh is not None
    await actor.shutdown()


async def test_a_retried_hand_over_is_neither_lost_nor_duplicated(
    tokenizer, answer_ids
):
    """A worker retries a hand-over under the same id after its connection dropped: one seat, one trajectory."""
    from roll_async.scheduler.rollout_scheduler import GroupQueueActor

    config = make_config(num_env_groups=2, group_size=2, mode="async", max_staleness=1)
    actor = GroupQueueActor(rollout_spec(config, "train"), start_step=0)
    queue = actor.queue
    first = await actor.next_episode(0, 0, "seat-1")
    assert await actor.next_episode(0, 0, "seat-1") == first  # the retry: the same seat
    assert sum(len(g["in_flight"]) for g in queue.describe()["pending"]["count"]) == 1
    finished = Trajectory(
        tag=first.tag,
        group_id=first.group_id,
        episode_id=first.episode_id,
        env_id=0,
        seed=first.seed,
        traj_id="done",
        created_step=first.created_step,
        stop_reason="terminated",
    )
    queue.suspend(
        cancel_in_flight=False
    )  # the next seat waits, so the retry comes while it is handled
    handing_over = asyncio.create_task(
        actor.put_trajectory_and_next_episode(finished, 0, "hand-over-2")
    )
    await asyncio.sleep(0.05)
    retry = asyncio.create_task(
        actor.put_trajectory_and_next_episode(finished, 0, "hand-over-2")
    )
    await asyncio.sleep(0.05)
    queue.resume()
    second, again = await asyncio.wait_for(asyncio.gather(handing_over, retry), 5)
    assert second == again and second != first
    pending = queue.describe()["pending"]["count"]
    group = next(g for g in pending if g["group_id"] == first.group_id)
    assert group["done"] == 1  # the trajectory counted once
    assert sum(len(g["in_flight"]) for g in pending) == 1  # one seat for env 0
    assert queue.counters.late_trajectories == 0
    assert (await actor.describe())["handover_retries"] == 2
    await actor.shutdown()


async def test_a_cancel_that_arrives_before_its_seat_ends_the_episode_at_once(
    tokenizer, answer_ids
):
    """Cancels travel as Ray calls, seats over ZMQ: a cancel may reach the worker before the seat does."""
    from roll_async.env_managers.worker import build_env_managers
    from roll_async.trajectory import EpisodeSpec

    class OneSeat:
        def __init__(self) -> None:
            self.seat_arrives = asyncio.Event()
            self.asked = 0
            self.received: list[Trajectory] = []

        async def next_episode(self, env_id):
            self.asked += 1
            if self.asked > 1:
                return None  # stop after the one seat
            await self.seat_arrives.wait()
            return EpisodeSpec(
                tag="count", group_id=5, episode_id=0, seed=1, created_step=0
            )

        async def put_trajectory(self, trajectory):
            self.received.append(trajectory)

    engine = FakeEngine(lambda r: answer_ids)
    scheduler = OneSeat()
    (manager,) = build_env_managers(
        rollout_spec(make_config(), "train"),
        [(0, "count")],
        scheduler=scheduler,
        engine_for=lambda env_id: engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    loop = asyncio.create_task(manager.run_rollout_loop())
    await asyncio.sleep(0.05)
    assert manager.progress.phase == "waiting_for_episode"
    manager.cancel_episode(5, 0)  # the group completed; the seat is still on its way
    scheduler.seat_arrives.set()
    await asyncio.wait_for(loop, 5)
    assert engine.prompts == []  # not one turn played
    assert scheduler.received == []  # nothing handed over to be discarded as late
    assert manager.stats.cancelled_episodes == 1
    assert manager.stats.cancelled_before_start == 1
