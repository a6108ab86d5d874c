"""weight_sync.interval and the staleness bound: sync mode stays on-policy, async lag counts weight versions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import load_config
from roll_async.errors import ConfigError
from roll_async.scheduler.queue_rules import QueueRules
from tests.unit.scheduler.test_scheduler_group_queue import finished, make_queue, take

SOKOBAN = Path(__file__).resolve().parents[3] / "configs" / "sokoban.yaml"


def test_sync_mode_refuses_a_weight_sync_interval_above_one():
    with pytest.raises(
        ConfigError,
        match=r"weight_sync.interval=2 with mode=sync.*weight_sync.interval=1",
    ):
        load_config(SOKOBAN, ["mode=sync", "weight_sync.interval=2"])


def test_async_mode_refuses_an_interval_the_staleness_bound_cannot_hold():
    with pytest.raises(
        ConfigError, match=r"weight_sync.interval=3 with max_staleness=1.*max_staleness"
    ):
        load_config(
            SOKOBAN, ["mode=async", "max_staleness=1", "weight_sync.interval=3"]
        )
    config = load_config(
        SOKOBAN, ["mode=async", "max_staleness=2", "weight_sync.interval=2"]
    )
    assert QueueRules.for_spec(rollout_spec(config, "train")).weight_sync_interval == 2


@pytest.mark.parametrize("max_staleness, interval", [(2, 2), (2, 3), (1, 2), (3, 2)])
async def test_observed_version_lag_never_exceeds_max_staleness(
    max_staleness, interval
):
    """Envs make groups while the trainer trains (engines still on the old version); the
    pipeline syncs after step s when (s + 1) % interval == 0. Lag = trainer version - engine version used."""
    queue = make_queue(
        group_size=1,
        mode="async",
        staleness_bound=max_staleness,
        weight_sync_interval=interval,
    )
    engine_version = 0
    made_with: dict[str, int] = {}
    lags: list[int] = []
    env = 0

    async def fill() -> None:
        nonlocal env
        while (spec := await take(queue, env, timeout=0.02)) is not None:
            trajectory = finished(spec, env)
            made_with[trajectory.traj_id] = engine_version
            await queue.put_trajectory(trajectory)
            env = (env + 1) % 4

    for step in range(12):
        batch = asyncio.create_task(queue.get_batch(step=step))
        while not batch.done():
            await fill()
            await asyncio.sleep(0)
        served = batch.result()
        lags += [step - made_with[t.traj_id] for t in served.trajectories]
        await fill()  # during training: groups made with the engines' current weights
        if (step + 1) % interval == 0:
            engine_version = step + 1
    assert max(lags) <= max_staleness, lags
