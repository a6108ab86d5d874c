"""Summary statistics of one benchmark run: pure functions over trajectories, batch windows and engine samples.

Definitions (benchmarks/README.md repeats them next to the figures):

* **request shapes**: every model turn is one engine request; its prompt length
  is the conversation length before the turn, its output length the tokens the
  model generated in it (one run of 1s in ``response_mask``).
* **tail share** (Seer's "the last 10% of requests take up to half of a
  synchronous rollout"): for each batch of ``n`` trajectories, the time during
  which only its slowest ``k = max(1, ceil(0.1 n))`` episodes were still
  running: from the finish of the ``(n - k)``-th episode to the moment the
  batch was ready, clipped to the batch's own window (which opens when the
  previous batch was ready). Summed over batches and divided by the run's wall
  time: the share of wall time spent waiting only for the slowest 10%.
* **engine busy fraction**: share of engine samples (taken every
  ``sample_interval_s``) with at least one request in flight; **mean in
  flight**: the average number of requests in flight over the samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll_async.metrics import mean, percentile
from roll_async.trajectory import Trajectory


def request_shapes(trajectory: Trajectory) -> list[tuple[int, int]]:
    """(prompt_len, output_len) of each engine request of an episode, from its response mask.

    A turn continued after an engine abort counts as one request here, and a
    turn that generated nothing (never seen in practice) leaves no run and is
    not counted.
    """
    shapes: list[tuple[int, int]] = []
    mask = trajectory.response_mask
    i, n = 0, len(mask)
    while i < n:
        if mask[i]:
            start = i
            while i < n and mask[i]:
                i += 1
            shapes.append((start, i - start))
        else:
            i += 1
    return shapes


def mean_request_shape(trajectories: Iterable[Trajectory]) -> tuple[float, float, int]:
    """(mean prompt length, mean output length, number of requests) over all turns of ``trajectories``."""
    prompts: list[int] = []
    outputs: list[int] = []
    for t in trajectories:
        for p, o in request_shapes(t):
            prompts.append(p)
            outputs.append(o)
    return mean(prompts), mean(outputs), len(prompts)


@dataclass
class BatchWindow:
    """One batch: when its window opened (previous batch ready, or run start), when it was ready, and its episodes' finish times."""

    start: float
    end: float
    finish_times: list[float] = field(default_factory=list)


def batch_tail_seconds(window: BatchWindow, fraction: float = 0.1) -> float:
    """Seconds of the window during which only the batch's slowest ``k = max(1, ceil(fraction * n))`` episodes ran.

    That is, from the finish of the ``(n - k)``-th episode (clipped to the window) to the window's end.
    """
    n = len(window.finish_times)
    if n == 0 or window.end <= window.start:
        return 0.0
    k = max(1, math.ceil(fraction * n))
    if k >= n:
        return window.end - window.start
    ordered = sorted(window.finish_times)
    threshold = min(max(ordered[n - k - 1], window.start), window.end)
    return window.end - threshold


def tail_share(
    windows: Sequence[BatchWindow], wall_s: float, fraction: float = 0.1
) -> float:
    """Share of ``wall_s`` spent waiting only for the slowest ``fraction`` of each batch's episodes."""
    if wall_s <= 0:
        return 0.0
    return min(1.0, sum(batch_tail_seconds(w, fraction) for w in windows) / wall_s)


@dataclass
class EngineSample:
    t: float
    in_flight: float
    running: float = 0.0
    waiting: float = 0.0
    generation_tokens: float = 0.0


def busy_stats(samples: Sequence[EngineSample]) -> tuple[float, float]:
    """(busy fraction, mean requests in flight) over the samples."""
    if not samples:
        return 0.0, 0.0
    busy = sum(1 for s in samples if s.in_flight > 0) / len(samples)
    return busy, mean([s.in_flight for s in samples])


def summarize_run(
    trajectories: Sequence[Trajectory],
    *,
    wall_s: float,
    windows: Sequence[BatchWindow],
    batch_waits: Sequence[float],
    samples: Sequence[EngineSample] = (),
    engine_generated_tokens: float | None = None,
) -> dict[str, Any]:
    """The figures of one (workload, grid point, scheduler) run; keys are the CSV columns."""
    ok = [t for t in trajectories if t.stop_reason != "env_error"]
    tokens = sum(t.response_length for t in ok)
    latencies = [
        t.finished_at - t.started_at for t in ok if t.finished_at >= t.started_at > 0
    ]
    prompt_mean, output_mean, requests = mean_request_shape(ok)
    busy, in_flight = busy_stats(samples)
    env_steps = [turn.env_step_s for t in ok for turn in t.turns]
    generates = [turn.generate_s for t in ok for turn in t.turns]
    stop_reasons: dict[str, int] = {}
    for t in trajectories:
        stop_reasons[t.stop_reason] = stop_reasons.get(t.stop_reason, 0) + 1
    return {
        "trajectories": len(ok),
        "env_errors": len(trajectories) - len(ok),
        "wall_s": wall_s,
        "trajectories_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "engine_tokens_per_s": (engine_generated_tokens / wall_s)
        if engine_generated_tokens is not None and wall_s > 0
        else float("nan"),
        "requests": requests,
        "mean_prompt_len": prompt_mean,
        "mean_output_len": output_mean,
        "turns_mean": mean([float(t.num_turns) for t in ok]),
        "turns_max": max((t.num_turns for t in ok), default=0),
        "response_len_mean": mean([float(t.response_length) for t in ok]),
        "episode_latency_p50_s": percentile(latencies, 50),
        "episode_latency_p99_s": percentile(latencies, 99),
        "episode_latency_max_s": max(latencies, default=0.0),
        "tail10_share": tail_share(windows, wall_s),
        "get_batch_wait_mean_s": mean(list(batch_waits)),
        "get_batch_wait_total_s": float(sum(batch_waits)),
        "engine_busy_fraction": busy,
        "engine_mean_in_flight": in_flight,
        "generate_p99_s": percentile(generates, 99),
        "env_step_p50_s": percentile(env_steps, 50),
        "env_step_p99_s": percentile(env_steps, 99),
        "stop_reasons": stop_reasons,
    }
