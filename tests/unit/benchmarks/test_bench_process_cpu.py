"""benchmarks/process_cpu.py: CPU by process role over a run's window."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks import process_cpu

psutil = pytest.importorskip("psutil")


@pytest.mark.parametrize(
    ("name", "cmdline", "role"),
    [
        ("VLLM::Worker", "", "vllm_model_worker"),
        ("python", "VLLM::EngineCore", "vllm_engine_core"),
        ("ray::VLLMEngine.generate", "ray::VLLMEngine.generate", "engine_actor"),
        ("ray::EnvManagerWorker", "ray::EnvManagerWorker.run", "env_workers"),
        ("ray::GroupQueueActor", "ray::GroupQueueActor.get_batch", "queue_actor"),
        (
            "raylet",
            "/x/ray/core/src/ray/raylet/raylet --node_ip_address=...",
            "ray_system",
        ),
        ("python", "python something_else.py", "other"),
    ],
)
def test_processes_are_told_apart_by_role(name, cmdline, role):
    assert process_cpu.role_of(name, cmdline) == role


def test_a_busy_child_process_is_counted_and_the_window_excludes_what_came_before():
    before = process_cpu.snapshot()
    assert before[os.getpid()][0] == "driver"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # the child burns 0.3 s of CPU, then sleeps: wait until it has
            after = process_cpu.snapshot()
            if after.get(child.pid, ("", 0.0))[1] >= 0.3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        spent = process_cpu.cpu_seconds_by_role(before, after)
        # the child, started inside the window, counts from zero
        assert 0.3 <= spent["other"] < 1.0
        middle = process_cpu.snapshot()
        time.sleep(0.2)
        idle = process_cpu.cpu_seconds_by_role(middle, process_cpu.snapshot())
        assert (
            idle.get("other", 0.0) < 0.05
        )  # a sleeping child costs nothing in a later window
    finally:
        child.kill()
        child.wait()
    notes = process_cpu.notes_from(before, after)
    cores = process_cpu.cores_from(notes, wall_s=2.0)
    assert cores["cpu_cores_other"] == pytest.approx(notes["cpu_s_other"] / 2.0)
    assert process_cpu.notes_from({}, after) == {}


async def test_the_ray_call_cost_engine_streams_results_in_completion_order():
    """benchmarks/ray_call_cost.py's stand-in engine: request and result shapes as the rollout's, no model."""
    from benchmarks.ray_call_cost import EchoEngine
    from roll_async.trajectory import GenerationRequest

    engine = EchoEngine(output_len=4, latency_s=0.0)
    requests = [
        GenerationRequest(
            request_id=f"r{i}", prompt_token_ids=[1] * (i + 1), max_tokens=4
        )
        for i in range(3)
    ]
    results = [result async for result in engine.generate_stream(requests)]
    assert sorted(r.request_id for r in results) == ["r0", "r1", "r2"]
    assert all(
        r.output_token_ids == [0, 1, 2, 3] and len(r.logprobs) == 4 for r in results
    )
    assert {r.request_id: r.num_prompt_tokens for r in results} == {
        "r0": 1,
        "r1": 2,
        "r2": 3,
    }
