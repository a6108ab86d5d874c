"""Garbage-collector settings for a process that hosts thousands of env loops.

Every env loop allocates small objects each turn (requests, futures, timer
handles, token lists), so Python's default first-generation threshold (700
allocations) runs a collection every few turns, and each older-generation pass
walks every long-lived object (envs, tokenizers, trajectories in flight). None
of these objects form cycles that must be reclaimed quickly; reference counting
frees them. Measured with ``benchmarks/scale_sim.py`` (2,000 envs, 2 CPUs):
about a fifth of the rollout side's CPU per turn went to the collector. At 50,000 envs a young
threshold of 50,000 still left 135 µs per trajectory in the collector (80 in young collections, 55
in older ones); at 250,000 it took 66 µs, almost none in older collections (``gc.callbacks``
timing, one run each, 2 trajectories per env).

An EnvManagerWorker calls :func:`tune_gc_for_env_loops` once, after building
its env managers: the objects built so far move to the permanent generation
(``gc.freeze``) and young collections run every ``threshold0`` allocations.
The setting is per process: the driver (a LocalRolloutScheduler, a user's
script) is never changed behind its back.
"""

from __future__ import annotations

import gc

#: Allocations between young collections (Python's default: 700); 0 leaves the process's settings alone.
DEFAULT_THRESHOLD0 = 250_000


def tune_gc_for_env_loops(threshold0: int = DEFAULT_THRESHOLD0) -> tuple[int, int, int]:
    """Freeze what the process holds now and collect young objects every ``threshold0`` allocations.

    Returns the thresholds in force afterwards.
    """
    if threshold0 > 0:
        gc.collect()
        gc.freeze()
        _, threshold1, threshold2 = gc.get_threshold()
        gc.set_threshold(threshold0, max(threshold1, 50), max(threshold2, 100))
    return gc.get_threshold()
