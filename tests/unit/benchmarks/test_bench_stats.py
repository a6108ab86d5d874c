"""Summary statistics of the grouping benchmark (benchmarks/grouping_stats.py): pure functions."""

from __future__ import annotations

import math

import pytest

from benchmarks.grouping_stats import (
    BatchWindow,
    EngineSample,
    batch_tail_seconds,
    busy_stats,
    mean_request_shape,
    request_shapes,
    summarize_run,
    tail_share,
)
from roll_async.trajectory import Trajectory, TurnRecord


def trajectory(
    segments: list[tuple[int, int]],
    *,
    started: float = 0.0,
    finished: float = 1.0,
    stop: str = "terminated",
) -> Trajectory:
    """segments: (prompt-side tokens, generated tokens) per turn."""
    t = Trajectory(
        tag="x",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=1,
        traj_id="x",
        created_step=0,
        started_at=started,
        finished_at=finished,
        stop_reason=stop,
    )
    for turn, (context, generated) in enumerate(segments):
        t.token_ids += [1] * (context + generated)
        t.response_mask += [0] * context + [1] * generated
        t.turns.append(TurnRecord(turn, "a", "o", 0.0, generated, 0, 0.1, 0.2))
    t.prompt_length = segments[0][0]
    return t


def test_request_shapes_are_prompt_length_before_each_turn_and_its_output():
    t = trajectory([(10, 4), (3, 5), (2, 1)])
    assert request_shapes(t) == [(10, 4), (17, 5), (24, 1)]
    prompt, output, n = mean_request_shape([t, trajectory([(6, 2)])])
    assert (
        n == 4
        and prompt == pytest.approx((10 + 17 + 24 + 6) / 4)
        and output == pytest.approx(12 / 4)
    )


def test_tail_is_the_time_only_the_slowest_tenth_was_running():
    # 20 episodes: 18 finish by t=2, the slowest 2 (k = ceil(0.1 * 20)) run until 10: tail = 10 - 2.
    finishes = [1.0] * 10 + [2.0] * 8 + [6.0, 10.0]
    window = BatchWindow(0.0, 10.0, finishes)
    assert batch_tail_seconds(window) == pytest.approx(8.0)
    assert tail_share([window], wall_s=10.0) == pytest.approx(0.8)
    # Evenly spread finishes: the tail is the last 10% of the time.
    even = BatchWindow(0.0, 100.0, [float(i) for i in range(1, 101)])
    assert batch_tail_seconds(even) == pytest.approx(10.0)


def test_tail_is_clipped_to_the_batch_window_and_small_batches_have_one_slowest_episode():
    # Per-env batches: trajectories that finished before the window opened do not count as tail.
    early = BatchWindow(5.0, 6.0, [1.0, 2.0, 3.0, 5.5])
    # k=1: from max(3.0, 5.0) to 6.0
    assert batch_tail_seconds(early) == pytest.approx(1.0)
    tiny = BatchWindow(0.0, 4.0, [1.0, 3.0])
    assert batch_tail_seconds(tiny) == pytest.approx(3.0)  # k=1 of 2: from 1.0 to 4.0
    assert batch_tail_seconds(BatchWindow(0.0, 1.0, [])) == 0.0
    assert tail_share(
        [BatchWindow(0, 10, [9, 10]), BatchWindow(10, 20, [15, 20])], wall_s=20.0
    ) == pytest.approx((1 + 5) / 20)
    assert tail_share([], wall_s=0.0) == 0.0


def test_busy_fraction_and_mean_in_flight():
    samples = [EngineSample(t=i, in_flight=v) for i, v in enumerate([0, 2, 4, 0, 4])]
    busy, in_flight = busy_stats(samples)
    assert busy == pytest.approx(0.6) and in_flight == pytest.approx(2.0)
    assert busy_stats([]) == (0.0, 0.0)


def test_summarize_run_reports_throughput_latency_and_stop_reasons():
    trajectories = [
        trajectory([(10, 4), (3, 4)], started=100.0, finished=102.0),
        trajectory([(10, 2)], started=100.0, finished=101.0),
        trajectory([(10, 2)], started=100.0, finished=101.0, stop="env_error"),
    ]
    row = summarize_run(
        trajectories,
        wall_s=4.0,
        windows=[BatchWindow(100.0, 102.0, [102.0, 101.0])],
        batch_waits=[2.0, 1.0],
        samples=[EngineSample(0, 1), EngineSample(1, 0)],
        engine_generated_tokens=20,
    )
    assert row["trajectories"] == 2 and row["env_errors"] == 1
    assert row["trajectories_per_s"] == pytest.approx(0.5)
    assert row["tokens_per_s"] == pytest.approx(10 / 4) and row[
        "engine_tokens_per_s"
    ] == pytest.approx(5.0)
    assert row["episode_latency_p50_s"] == 1.0 and row["episode_latency_p99_s"] == 2.0
    assert row["get_batch_wait_mean_s"] == pytest.approx(1.5)
    assert row["engine_busy_fraction"] == pytest.approx(0.5)
    assert row["stop_reasons"] == {"terminated": 2, "env_error": 1}
    assert row["tail10_share"] == pytest.approx(1.0 / 4)
    assert row["turns_max"] == 2 and row["mean_output_len"] == pytest.approx(10 / 3)
    assert math.isnan(
        summarize_run([], wall_s=1.0, windows=[], batch_waits=[])["engine_tokens_per_s"]
    )
