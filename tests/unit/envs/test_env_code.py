"""The code env and its sandbox: every limit is exercised for real (processes, rlimits, network namespace)."""

from __future__ import annotations

import socket
import threading

import pytest

from roll_async.envs import make_env
from roll_async.envs.code import extract_code, grade, load_tasks
from roll_async.envs.sandbox import SandboxLimits, network_isolation, run_python

FAST = SandboxLimits(
    cpu_s=1, wall_s=20, memory_mb=128, max_output_bytes=4096, max_processes=8
)


def test_ships_at_least_50_tasks_each_solved_by_its_reference_solution():
    tasks = load_tasks()
    assert len(tasks) >= 50 and len({t["id"] for t in tasks}) == len(tasks)
    for task in tasks:  # in-process: checks the data (the sandbox path is tested below)
        namespace: dict = {}
        exec(task["solution"], namespace)
        for test in task["tests"]:
            exec(test, namespace)
        assert task["function"] in namespace


def test_grading_runs_in_the_sandbox_and_counts_passed_tests():
    task = next(t for t in load_tasks() if t["id"] == "fizzbuzz")
    assert grade(task["solution"], task["tests"], FAST)[0] == len(task["tests"])
    wrong = "def fizzbuzz(n):\n    print('FAKE 3')\n    return []"
    assert (
        grade(wrong, task["tests"], FAST)[0] == 1
    )  # only the n == 0 test; printing cannot fake a result


def test_an_episode_runs_code_then_submits_and_is_graded():
    env = make_env("code", {"max_steps": 3})
    observation, info = env.reset(7)
    assert "Task:" in observation and "<answer>" in info["instruction"]
    observation, reward, terminated, _, info = env.step(
        "Try:\n```python\nprint(6 * 7)\n```"
    )
    assert (
        "42" in observation
        and "exit code 0" in observation
        and not terminated
        and reward == 0.0
    )
    observation, reward, terminated, _, info = env.step("no code here")
    assert reward == pytest.approx(-0.1) and not info["metrics"]["action_is_valid"]
    answer = env.expert_responses()[0]
    observation, reward, terminated, _, info = env.step(answer)
    assert (
        terminated
        and reward == 1.0
        and info["metrics"]["success"]
        and info["metrics"]["num_runs"] == 1.0
    )
    assert "tests passed" in observation


def test_a_fenced_submission_inside_the_answer_tags_is_unwrapped():
    assert (
        extract_code("\n```python\ndef f():\n    return 1\n```\n")
        == "def f():\n    return 1"
    )


def test_wall_clock_timeout_kills_code_that_sleeps():
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=1.0))
    assert result.status == "timeout" and result.seconds < 30


def test_cpu_time_limit_stops_a_busy_loop():
    result = run_python("while True:\n    pass", FAST)
    assert result.status == "cpu_limit"


def test_memory_limit_stops_a_large_allocation():
    result = run_python("x = bytearray(1024 ** 3)\nprint('allocated')", FAST)
    assert result.status == "memory_limit" and "allocated" not in result.stdout


def test_output_size_is_limited():
    result = run_python("while True:\n    print('x' * 1000)", FAST)
    assert (
        result.status == "output_limit" and len(result.stdout) <= FAST.max_output_bytes
    )
    assert "output limit" in result.report()


def test_fork_bomb_is_stopped_by_the_process_limit():
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print('stopped after', n)"
    )
    result = run_python(code, FAST)
    assert "stopped after" in result.stdout
    assert int(result.stdout.split()[-1]) < 64


def test_network_is_unreachable_from_the_sandbox():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(
        target=lambda: accepted.append(listener.accept()), daemon=True
    ).start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
    try:
        blocked = run_python(code, FAST)
        assert "connected" not in blocked.stdout and blocked.status == "error"
        assert (
            ("Network is unreachable" in blocked.stderr)
            if network_isolation() == "netns"
            else ("disabled" in blocked.stderr)
        )
        allowed = run_python(
            code, SandboxLimits(cpu_s=1, wall_s=20, network=True)
        )  # the control: same code, network on
        assert "connected" in allowed.stdout
    finally:
        listener.close()
