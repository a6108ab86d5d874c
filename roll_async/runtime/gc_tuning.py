"""Garbage-collector settings for a process that hosts thousands of env loops.

Every env loop allocates small objects each turn, so Python's default young
threshold runs a collection every few turns and each older pass walks every
long-lived object (envs, tokenizers, trajectories in flight), though none of
these objects form cycles that must be reclaimed quickly; a process hosting env
loops freezes what it holds and collects young objects far less often.
"""

from __future__ import annotations

import gc

#: Allocations between young collections (Python's default: 700); 0 leaves the process's settings alone.
DEFAULT_THRESHOLD0 = 250_000


def tune_gc_for_env_loops(threshold0: int = DEFAULT_THRESHOLD0) -> tuple[int, int, int]:
    """Freeze what the process holds now and collect young objects every ``threshold0`` allocations.

    Returns the thresholds in force afterwards.

    An EnvManagerWorker calls :func:`tune_gc_for_env_loops` once, after building
    its env managers: the objects built so far move to the permanent generation
    (``gc.freeze``) and young collections run every ``threshold0`` allocations.
    The setting is per process: the driver (a LocalRolloutScheduler, a user's
    script) is never changed behind its back.
    """
    if threshold0 > 0:
        gc.collect()
        gc.freeze()
        _, threshold1, threshold2 = gc.get_threshold()
        gc.set_threshold(threshold0, max(threshold1, 50), max(threshold2, 100))
    return gc.get_threshold()
