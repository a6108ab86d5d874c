"""Placement across nodes on one machine: several raylets (ray.cluster_utils.Cluster), workers spread, run completes.

Runs ``multinode_rollout.py`` in a subprocess: this session already owns a Ray
instance, and a process can join only one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_workers_reserve_cpus_on_three_raylets_and_the_rollout_completes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "integration" / "multinode_rollout.py"),
            str(tmp_path / "tok"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(
        [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    )
    assert result["cluster_nodes"] == 3
    assert result["batches"] == [4, 4, 4]
    # one worker per node
    assert len(result["worker_nodes"]) == 3 and len(set(result["worker_nodes"])) == 3
