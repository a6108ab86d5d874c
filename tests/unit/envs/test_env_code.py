"""The code env and its sandbox: every limit is exercised for real (processes, rlimits, network namespace)."""

from __future__ import annotations

import ast
import gc
import json
import math
import secrets
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from roll_async.envs import make_env
from roll_async.envs.code import (
    decode_result,
    extract_code,
    grade,
    load_tasks,
    split_test,
)
from roll_async.workspaces import sandbox
from roll_async.workspaces.sandbox import (
    SandboxLimits,
    namespace_problem,
    network_isolation,
    run_python,
)

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


def test_every_reference_solution_passes_the_sandboxed_grader():
    tasks = load_tasks()
    with ThreadPoolExecutor(4) as pool:
        passed = list(
            pool.map(
                lambda t: grade(t["solution"], t["tests"], FAST, t["function"])[0],
                tasks,
            )
        )
    failing = [t["id"] for t, n in zip(tasks, passed) if n != len(t["tests"])]
    assert not failing, failing


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


needs_namespaces = pytest.mark.skipif(
    namespace_problem() is not None,
    reason=f"no PID namespace here: {namespace_problem()}",
)
#: Reads the grader's frame for the hidden tests and the old per-run nonce, prints the nonce line with
#: a full score and exits before any test runs: "passed 3 of 3" on the grader that ran tests in-process.
FRAME_EXPLOIT = r"""
import os, re, sys
frame, found = sys._getframe(), []
while frame is not None:
    found += [c for c in frame.f_code.co_consts if isinstance(c, str)]
    found += [v for v in frame.f_globals.values() if isinstance(v, str)]
    frame = frame.f_back
for text in found:
    match = re.match(r"\n([0-9a-f]{16}) $", text)
    if match:
        os.write(1, ("\n%s 3\n" % match.group(1)).encode())
os.write(1, b'\n[["ok", ["bool", true]], ["ok", ["bool", true]], ["ok", ["bool", true]]]\n')
os._exit(0)
def fizzbuzz(n):
    return None
"""


def test_a_wrong_solution_cannot_read_the_tests_and_fake_a_pass():
    task = next(t for t in load_tasks() if t["id"] == "fizzbuzz")
    passed, result = grade(FRAME_EXPLOIT, task["tests"], FAST, "fizzbuzz")
    assert passed == 0, result.report()
    for test in task["tests"]:  # nothing of the checks reached the program
        assert test not in result.stdout


def test_tests_split_into_sandboxed_calls_and_a_check_the_parent_evaluates():
    split = split_test("assert len(power_set([1, 2])) == 4", "power_set", "t")
    assert split.calls == ("power_set([1, 2])",)
    split = split_test("assert not f(1) and f(g(2)) == 'x' * 3", "f", "t")
    assert split.calls == ("f(1)", "f(g(2))")
    assert eval(split.check, {"__result__": [False, "xxx"].__getitem__})
    assert not eval(split.check, {"__result__": [True, "xxx"].__getitem__})
    every_task_splits = [
        split_test(test, t["function"], t["id"])
        for t in load_tasks()
        for test in t["tests"]
    ]
    assert all(s.calls for s in every_task_splits)


def test_tests_split_in_two_threads_at_once_both_split():
    """Graders run in threads (the env pool, the probes' fixture); a split must survive another thread's.

    CPython 3.11.7's ``ast`` keeps one recursion counter per interpreter, so a thread switch while one
    thread builds an AST (here: a finalizer run by the garbage collector, waiting on another thread)
    lets the other thread's parse reset it, and the first raised ``SystemError: AST constructor
    recursion depth mismatch``, which failed every probe of a CI run. A collection inside ``ast.parse``
    stands in for the finalizer.
    """
    test = "assert fizzbuzz(15) == ['1', '2', 'Fizz'] and fizzbuzz(3)[-1] == 'Fizz'"
    other_done, errors = threading.Event(), []

    def deeper(n: int) -> None:  # another stack depth, so another starting count
        if n:
            return deeper(n - 1)
        try:
            split_test(test, "fizzbuzz", "other")
        except Exception as exc:  # noqa: BLE001 - the test reports it below
            errors.append(exc)
        other_done.set()

    fired = []

    def switch_threads_inside_parse(phase: str, info: dict) -> None:
        # A collection while ast.parse builds its tree: let the other thread run (or wait for this one).
        if not fired and sys._getframe(1).f_code is ast.parse.__code__:
            fired.append(phase)
            threading.Thread(target=deeper, args=(20,), daemon=True).start()
            other_done.wait(0.5)

    threshold = gc.get_threshold()
    gc.callbacks.append(switch_threads_inside_parse)
    gc.set_threshold(1)
    try:
        split = split_test(test, "fizzbuzz", "this")
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(switch_threads_inside_parse)
    assert fired, "no collection ran inside ast.parse"
    assert other_done.wait(10) and not errors, errors
    assert split.calls == ("fizzbuzz(15)", "fizzbuzz(3)")


@pytest.mark.parametrize(
    "test",
    [
        "assert all(f(x) for x in [1, 2])",
        "assert list(map(f, [1])) == [2]",
        "x = f(1); assert x == 2",
        "assert (y := f(1)) == 2",
        "assert 1 == 1",
        "assert f(",
    ],
)
def test_a_test_that_cannot_be_split_fails_at_load_naming_its_task(tmp_path, test):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(
        json.dumps(
            {
                "tasks": [
                    {
                        "id": "odd_one",
                        "function": "f",
                        "prompt": "p",
                        "solution": "def f(x):\n    return x + 1",
                        "tests": ["assert f(1) == 2", test],
                    }
                ]
            }
        )
    )
    with pytest.raises(ValueError, match="code task 'odd_one'") as error:
        make_env("code", {"tasks_path": str(tasks)})
    assert "\n" not in str(error.value)


def test_results_come_back_as_exact_plain_types_only():
    nested = {"k": [1, (2, 3)], 4: {5, frozenset({6})}, b"\x00": None, "f": -2.5}
    program = (
        "def f():\n    return [-(10 ** 5000), float('-inf'), True]\n"
        f"def g():\n    return float('nan')\ndef h():\n    return {nested!r}\n"
    )
    tests = [
        "assert f() == [-(10 ** 5000), float('-inf'), True]",
        "assert g() != g()",
        f"assert h() == {nested!r}",
        "assert type(f()[2]) is bool",
    ]
    assert grade(program, tests, FAST, "f")[0] == 4
    assert math.isnan(decode_result(["float", "nan"]))
    assert decode_result(["tuple", [["int", "-0x10"], ["none"]]]) == (-16, None)
    for forged in (
        ["int", "1e9"],
        ["int", 3],
        ["bool", 1],
        ["list", "abc"],
        ["object", []],
        ["dict", [[["list", []], ["none"]]]],
        [],
    ):
        with pytest.raises((ValueError, TypeError)):
            decode_result(forged)


def test_objects_that_lie_about_equality_do_not_pass():
    lying = (
        "class Liar(list):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "class Truthy(int):\n    def __bool__(self):\n        return True\n"
        "def fizzbuzz(n):\n    return Liar()\n"
        "def is_palindrome(s):\n    return Truthy(0)\n"
    )
    task = next(t for t in load_tasks() if t["id"] == "fizzbuzz")
    assert grade(lying, task["tests"], FAST, "fizzbuzz")[0] == 0
    assert grade(lying, ["assert is_palindrome('ab')"], FAST, "is_palindrome")[0] == 0


def test_a_shadowed_builtin_does_not_change_the_check():
    task = next(t for t in load_tasks() if t["id"] == "power_set")
    cheat = "def len(x):\n    return 16\ndef power_set(items):\n    return None\n"
    assert grade(cheat, task["tests"], FAST, "power_set")[0] == 0


def test_namespace_isolation_missing_is_refused_at_load_in_one_line(monkeypatch):
    monkeypatch.setattr(
        sandbox, "namespace_problem", lambda: "root (running as uid 1000)"
    )
    with pytest.raises(ValueError) as error:
        make_env("code", {})
    message = str(error.value)
    assert "sandbox_isolation=namespaces needs root" in message and "\n" not in message
    assert "sandbox_isolation: rlimits" in message
    env = make_env("code", {"sandbox_isolation": "rlimits", "task_ids": ["add"]})
    env.reset(0)
    _, reward, *_ = env.step(f"<answer>{env.task['solution']}</answer>")
    assert reward == 1.0
    with pytest.raises(RuntimeError, match="sandbox_isolation=namespaces"):
        run_python("pass", SandboxLimits(sandbox_isolation="namespaces"))


def _sandbox_processes() -> list[psutil.Process]:
    """Processes running as a sandbox uid (the per-run pool or nobody) on this host."""
    found = []
    for process in psutil.process_iter(["uids"]):
        uid = process.info["uids"].real if process.info["uids"] else None
        if uid == sandbox._NOBODY or (
            uid is not None
            and sandbox._UID_BASE <= uid < sandbox._UID_BASE + sandbox._UID_POOL
        ):
            found.append(process)
    return found


@needs_namespaces
def test_a_run_cannot_kill_a_concurrent_run():
    honest: list = []
    thread = threading.Thread(
        target=lambda: honest.append(
            run_python("import time\ntime.sleep(3)\nprint('alive')", FAST)
        )
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    killer = run_python(
        "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError as e:\n"
        "    print('reached nothing:', e)",
        FAST,
    )
    thread.join()
    assert killer.status == "ok", killer.report()  # it did not even kill itself
    assert honest[0].status == "ok" and "alive" in honest[0].stdout, honest[0].report()


@needs_namespaces
def test_nothing_a_run_starts_outlives_it():
    # The escaped grandchild becomes `sleep <token>`, so this run's leftover is told apart from
    # the sandbox processes of tests running beside it (xdist) by its command line.
    token = f"60.{secrets.randbelow(10**9):09d}"
    escape = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print('grandchild up', flush=True)\n"
        f"        os.execv('/bin/sleep', ['sleep', '{token}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\nprint('parent done')\n"
    )
    result = run_python(escape, FAST)
    assert "parent done" in result.stdout, result.report()
    assert "grandchild up" in result.stdout, result.report()
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if token in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, left


@needs_namespaces
def test_a_fork_bomb_in_one_run_does_not_starve_another_runs_forks():
    if sandbox.sandbox_uids() != "per_run":
        pytest.skip("runs share the nobody uid here, so RLIMIT_NPROC is shared")
    before = {p.pid for p in _sandbox_processes()}
    bomb = (
        "import os, time\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(4)\n            os._exit(0)\nexcept OSError:\n    time.sleep(4)\n"
    )
    thread = threading.Thread(target=run_python, args=(bomb, FAST))
    thread.start()
    deadline = time.monotonic() + 10
    while (
        len([p for p in _sandbox_processes() if p.pid not in before])
        < FAST.max_processes
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    forks = (
        "import os\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\nprint('forked')"
    )
    result = run_python(forks, FAST)
    thread.join()
    assert "forked" in result.stdout, result.report()


def test_run_python_without_namespaces_still_limits_and_reports():
    limits = SandboxLimits(
        cpu_s=1, wall_s=20, memory_mb=128, sandbox_isolation="rlimits"
    )
    assert run_python("print(6 * 7)", limits).stdout.strip() == "42"
    assert run_python("while True:\n    pass", limits).status == "cpu_limit"
    assert run_python("x = bytearray(1024 ** 3)", limits).status == "memory_limit"
    sleeper = run_python(
        "import time\ntime.sleep(30)",
        SandboxLimits(wall_s=1, sandbox_isolation="rlimits"),
    )
    assert sleeper.status == "timeout" and sleeper.seconds < 15
