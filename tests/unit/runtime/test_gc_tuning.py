"""EnvManagerWorker GC settings: applied per process, validated in the config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roll_async.config.schema import PipelineConfig, validate_config
from roll_async.errors import ConfigError


def _thresholds_after(threshold0: int) -> tuple[tuple[int, ...], int]:
    """Run the tuning in a fresh interpreter (it changes process-wide state): (thresholds, frozen objects)."""
    code = (
        "import gc\nfrom roll_async.runtime.gc_tuning import tune_gc_for_env_loops\n"
        f"t = tune_gc_for_env_loops({threshold0})\nprint(tuple(t), gc.get_freeze_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split(" ", 3)
    thresholds = tuple(int(x) for x in " ".join(out[:3]).strip("() \n").split(","))
    return thresholds, int(out[3])


def test_a_worker_freezes_what_it_built_and_collects_young_objects_less_often():
    thresholds, frozen = _thresholds_after(50_000)
    assert thresholds[0] == 50_000 and thresholds[1] >= 50 and thresholds[2] >= 100
    # the modules and objects built so far are out of the collector's walks
    assert frozen > 1000


def test_zero_leaves_python_defaults():
    thresholds, frozen = _thresholds_after(0)
    assert thresholds == (700, 10, 10) and frozen == 0


def test_a_negative_threshold_is_a_config_error():
    config = PipelineConfig()
    config.train_env_manager.worker_gc_threshold = -1
    with pytest.raises(ConfigError, match="train_env_manager.worker_gc_threshold=-1"):
        validate_config(config)
