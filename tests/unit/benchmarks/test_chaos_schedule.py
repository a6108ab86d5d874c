"""The chaos soak's schedule (benchmarks/chaos.py) is drawn from the seed and refused before any actor starts."""

from __future__ import annotations

import pytest

from benchmarks.chaos import (
    Fault,
    SoakConfig,
    SoakConfigError,
    draw_counts,
    draw_schedule,
    steps_needed,
    validate_schedule,
)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_drawn_schedule_fits_its_steps_and_repeats_for_its_seed(seed):
    soak = SoakConfig(seed=seed, counts=draw_counts(seed))
    soak.max_steps = steps_needed(soak)
    faults = draw_schedule(soak)
    validate_schedule(soak, faults)
    assert faults == draw_schedule(soak)
    assert sum(f.kind == "sigterm" for f in faults) == 1
    assert sum(f.kind == "replica_kill" for f in faults) == 1


def test_an_unknown_fault_kind_fails_naming_the_key():
    with pytest.raises(SoakConfigError, match=r"counts\.disk_full"):
        validate_schedule(SoakConfig(counts={"disk_full": 1}), [])
    with pytest.raises(SoakConfigError, match=r"faults\[0\]\.kind='oom'"):
        validate_schedule(SoakConfig(counts={}), [Fault("oom", 1)])  # type: ignore[arg-type]


def test_more_faults_than_steps_allow_fail_naming_the_step():
    soak = SoakConfig(seed=1, counts=draw_counts(1), max_steps=6)
    with pytest.raises(
        SoakConfigError, match=r"faults\[\d+\]\.step=.*more faults than steps allow"
    ):
        validate_schedule(soak, draw_schedule(soak))


def test_killing_every_replica_or_more_workers_than_the_budget_fails():
    soak = SoakConfig(counts={}, max_steps=20, num_replicas=2, max_worker_restarts=1)
    with pytest.raises(SoakConfigError, match=r"counts\.replica_kill=2"):
        validate_schedule(soak, [Fault("replica_kill", 1), Fault("replica_kill", 2)])
    with pytest.raises(SoakConfigError, match=r"counts\.worker_kill=2"):
        validate_schedule(soak, [Fault("worker_kill", 1), Fault("worker_kill", 2)])


def test_a_kill_shares_its_step_with_no_other_fault():
    soak = SoakConfig(counts={}, max_steps=20)
    with pytest.raises(SoakConfigError, match="step 3 holds"):
        validate_schedule(soak, [Fault("env_raise", 3), Fault("worker_kill", 3)])
    validate_schedule(soak, [Fault("env_raise", 3), Fault("env_hang", 3)])
