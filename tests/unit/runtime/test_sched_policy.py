"""The rollout processes' scheduling policy (roll_async/runtime/sched_policy.py): every thread, inherited, validated."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roll_async.config.schema import PipelineConfig, validate_config
from roll_async.errors import ConfigError
from roll_async.runtime.sched_policy import apply_to_process

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's"
)


def _in_fresh_process(policy: str) -> dict:
    """Apply ``policy`` in a fresh interpreter with threads already running, then start one more."""
    code = f"""
import json, threading
from roll_async.runtime import sched_policy
stop = threading.Event()
before = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in before: t.start()
applied = sched_policy.apply_to_process({policy!r})
after = threading.Thread(target=stop.wait); after.start()
counts = sched_policy.process_policies()
late = sched_policy.current(after.native_id)
stop.set()
print(json.dumps({{"applied": applied, "counts": counts, "late": late}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_batch_reaches_every_thread_and_the_threads_started_later():
    result = _in_fresh_process("batch")
    assert result["applied"] == "batch"
    assert result["counts"] == {
        "batch": 5
    }  # the main thread, three running ones and the late one
    assert result["late"] == "batch"


def test_normal_leaves_the_kernel_default():
    result = _in_fresh_process("normal")
    assert result["counts"] == {"normal": 5} and result["late"] == "normal"


def test_an_unknown_policy_is_named():
    with pytest.raises(
        ValueError, match="'fifo' is unknown; use one of \\['batch', 'normal'\\]"
    ):
        apply_to_process("fifo")


def test_an_unknown_policy_is_a_config_error_before_anything_starts():
    config = PipelineConfig()
    config.train_env_manager.rollout_sched_policy = "idle"
    with pytest.raises(
        ConfigError, match="train_env_manager.rollout_sched_policy='idle' is unknown"
    ):
        validate_config(config)
