"""The docker workspace runtime against the real daemon: commands, limits, files, the warm pool, and leaks.

Every test talks to dockerd (scripts/docker_setup.sh installs and starts it and builds the base image);
the module skips only when ROLL_ASYNC_REQUIRE_DOCKER is unset and no daemon answers (.ci/run sets it, so
CI fails instead of skipping). One runtime and its warm pool serve most tests; the leak tests run the
runtime in child processes that die by SIGKILL and SIGTERM, and count the run's containers by label.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from roll_async.errors import WorkspaceError
from roll_async.workspaces import docker_images
from roll_async.workspaces.docker import DockerRuntime, DockerRuntimeConfig, connect
from roll_async.workspaces.docker_reaper import count_run
from roll_async.workspaces.interface import Workspace, WorkspaceRuntime, WorkspaceSpec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
IMAGE = "roll-async/swe-base:1"
REQUIRED = bool(os.environ.get("ROLL_ASYNC_REQUIRE_DOCKER"))


def _daemon_problem() -> str | None:
    try:
        connect(5.0)
    except WorkspaceError as exc:
        return str(exc)
    return None


_PROBLEM = _daemon_problem()
if _PROBLEM is not None and not REQUIRED:
    pytest.skip(
        f"no Docker daemon ({_PROBLEM}); ROLL_ASYNC_REQUIRE_DOCKER=1 makes this fail",
        allow_module_level=True,
    )

SPEC = WorkspaceSpec(image=IMAGE, memory_mb=512, pids_limit=128)
#: One container for the limit tests: a small memory and process budget.
TIGHT = WorkspaceSpec(image=IMAGE, memory_mb=128, pids_limit=48)


@pytest.fixture(scope="module")
def api() -> Any:
    return connect(30.0)


@pytest.fixture(scope="module")
async def runtime() -> AsyncIterator[DockerRuntime]:
    assert _PROBLEM is None, _PROBLEM
    rt = DockerRuntime(DockerRuntimeConfig(pool_size=1, output_cap_bytes=2000))
    yield rt
    await rt.shutdown()
    assert rt.containers() == 0


async def test_commands_run_as_the_agent_in_the_workdir_with_the_task_files(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    assert isinstance(runtime, WorkspaceRuntime)
    (tmp_path / "app.py").write_text("print('from the task')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "data.txt").write_text("nested")
    ws = await runtime.start(
        WorkspaceSpec(image=IMAGE, files=tmp_path, env=(("K", "v"),))
    )
    try:
        assert isinstance(ws, Workspace)
        assert ws.stats.pool_hit is False and ws.stats.start_s > 0
        done = await ws.exec(
            "id -un; pwd; python3 app.py; cat pkg/data.txt; echo; echo $K; echo oops >&2; exit 3",
            timeout_s=20,
        )
        assert done.exit_code == 3 and not done.timed_out and not done.truncated
        assert done.output == "agent\n/workspace\nfrom the task\nnested\nv\noops\n"
        # the agent edits what it was given; the root file system is read-only; root is root
        edit = await ws.exec("echo more >> app.py && touch /etc/x", timeout_s=20)
        assert edit.exit_code == 1 and "Read-only file system" in edit.output
        assert (await ws.exec("id -u", timeout_s=20, user="root")).output == "0\n"
    finally:
        await ws.close()


async def test_a_timeout_kills_the_whole_command(runtime: DockerRuntime) -> None:
    ws = await runtime.start(SPEC)
    try:
        began = time.monotonic()
        done = await ws.exec("sleep 60 & sleep 60; echo never", timeout_s=1.0)
        assert done.timed_out and done.exit_code is None
        assert "never" not in done.output
        assert time.monotonic() - began < 20  # not the 60 s the command asked for
        left = await ws.exec("ps -u agent -o comm= | grep -c sleep", timeout_s=20)
        assert left.output.strip() == "0", left
        # a command that closes its output still runs to its timeout, and is killed there
        quiet = await ws.exec("echo bye; exec >&- 2>&-; sleep 60", timeout_s=1.0)
        assert quiet.timed_out and quiet.exit_code is None and quiet.output == "bye\n"
        closed = await ws.exec("exec >&- 2>&-; sleep 0.5; exit 4", timeout_s=20)
        assert closed.exit_code == 4 and not closed.timed_out
    finally:
        await ws.close()


async def test_output_keeps_head_and_tail_within_the_cap(
    runtime: DockerRuntime,
) -> None:
    ws = await runtime.start(SPEC)
    try:
        done = await ws.exec("seq 1 200000", timeout_s=20)
        assert done.exit_code == 0 and done.truncated
        assert done.output.startswith("1\n2\n3\n")
        assert done.output.endswith("199999\n200000\n")
        assert "bytes of output cut" in done.output and len(done.output) < 2100
    finally:
        await ws.close()


async def test_limits_contain_a_fork_bomb_and_memory_and_there_is_no_network(
    runtime: DockerRuntime,
) -> None:
    ws = await runtime.start(TIGHT)
    try:
        bomb = await ws.exec(":(){ :|:& };:", timeout_s=3.0)
        assert (
            "Resource temporarily unavailable" in bomb.output
        )  # the pids limit, not the host's
        assert bomb.seconds < 30
        await ws.kill_agent_processes()
        assert (await ws.exec("echo alive", timeout_s=20)).output == "alive\n"
        try:
            hog = await ws.exec(
                "python3 -c \"b = b'x' * (400 << 20); print('not limited')\"",
                timeout_s=30,
            )
        except WorkspaceError:
            pass  # the kernel's OOM killer took the container's init: the episode is lost, as it should be
        else:
            assert hog.exit_code is None and not hog.timed_out, hog
            assert "not limited" not in hog.output
        ws2 = ws if not ws.closed else await runtime.start(TIGHT)
        net = await ws2.exec(
            "ls /sys/class/net; python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"",
            timeout_s=20,
        )
        assert net.output.startswith("lo\n") and net.exit_code == 1
        assert "unreachable" in net.output
        if ws2 is not ws:
            await ws2.close()
    finally:
        await ws.close()


async def test_files_go_in_and_come_out(runtime: DockerRuntime, tmp_path: Path) -> None:
    ws = await runtime.start(SPEC)
    try:
        await ws.write_file("deep/dir/note.txt", b"hello\n", mode=0o600)
        assert await ws.read_file("/workspace/deep/dir/note.txt") == b"hello\n"
        assert await ws.read_file("deep/dir/note.txt", max_bytes=3) == b"hel"
        listing = await ws.exec("stat -c '%U %a' deep/dir/note.txt", timeout_s=20)
        assert listing.output == "agent 600\n"
        one = tmp_path / "one.txt"
        one.write_bytes(b"\x00binary\xff")
        await ws.copy_in(one, "inbox/")
        assert await ws.read_file("/workspace/inbox/one.txt") == b"\x00binary\xff"
        with pytest.raises(WorkspaceError, match="cannot create /opt/stuff"):
            await ws.copy_in(one, "/opt/stuff/")  # the root file system is read-only
        written = await ws.exec("echo made > made.txt", timeout_s=20)
        assert written.exit_code == 0
        assert await ws.read_file("made.txt") == b"made\n"
        linked = await ws.exec(
            "ln -s deep/dir/note.txt link && ln -s /etc/hostname host", timeout_s=20
        )
        assert linked.exit_code == 0
        # a link the agent planted is not followed (the contract: as the local runtime)
        for planted in ("link", "host"):
            with pytest.raises(WorkspaceError, match="not a regular file"):
                await ws.read_file(planted)
        assert await ws.read_file("/etc/hostname")
        big = await ws.exec("head -c 8000000 /dev/zero > big.bin", timeout_s=20)
        assert big.exit_code == 0
        assert await ws.read_file("big.bin", max_bytes=10) == bytes(10)
        with pytest.raises(WorkspaceError, match="does not exist"):
            await ws.read_file("missing.txt")
        with pytest.raises(WorkspaceError, match="directory"):
            await ws.read_file("deep")
    finally:
        await ws.close()


async def test_kill_agent_processes_ends_what_the_agent_left_running(
    runtime: DockerRuntime,
) -> None:
    ws = await runtime.start(SPEC)
    try:
        started = await ws.exec(
            "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo ok", timeout_s=20
        )
        assert started.output == "ok\n"
        assert (await ws.exec("pgrep -c -u agent sleep", timeout_s=20)).output == "1\n"
        await ws.kill_agent_processes()
        left = await ws.exec("pgrep -c -u agent sleep", timeout_s=20, user="root")
        assert left.output == "0\n"
    finally:
        await ws.close()


async def test_a_warm_pool_starts_faster_and_close_removes_the_container(
    runtime: DockerRuntime, api: Any
) -> None:
    await runtime.warm(SPEC)
    warm = await runtime.start(SPEC)
    assert warm.stats.pool_hit is True
    assert warm.stats.start_s < 0.5, warm.stats
    assert (await warm.exec("echo warm", timeout_s=20)).output == "warm\n"
    container = warm.container_id
    assert api.inspect_container(container)["State"]["Running"]
    await warm.close()
    await warm.close()
    assert not api.containers(all=True, filters={"id": container})


async def test_a_container_killed_mid_command_raises_and_is_removed(
    runtime: DockerRuntime, api: Any
) -> None:
    ws = await runtime.start(SPEC)
    running = asyncio.ensure_future(ws.exec("sleep 30", timeout_s=60))
    await asyncio.sleep(0.5)
    api.kill(ws.container_id)
    with pytest.raises(WorkspaceError, match=ws.container_id[:12]):
        await asyncio.wait_for(running, 20)
    assert not api.containers(all=True, filters={"id": ws.container_id})
    with pytest.raises(WorkspaceError, match="closed"):
        await ws.exec("echo again", timeout_s=20)


async def test_a_frozen_container_raises_instead_of_hanging(
    runtime: DockerRuntime, api: Any
) -> None:
    ws = await runtime.start(SPEC)
    api.pause(ws.container_id)
    with pytest.raises(WorkspaceError, match="paused"):
        await asyncio.wait_for(ws.exec("echo hi", timeout_s=5), 20)
    assert not api.containers(all=True, filters={"id": ws.container_id})


def _no_build(*args: object) -> None:
    raise AssertionError("the image was built again")


async def test_images_missing_built_once_and_failing_builds_name_the_fix(
    runtime: DockerRuntime, api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(WorkspaceError, match="docker_setup.sh"):
        await runtime.start(WorkspaceSpec(image="roll-async/no-such-image:0"))
    good = tmp_path / "good"
    good.mkdir()
    (good / "marker.txt").write_text(uuid.uuid4().hex)
    (good / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY marker.txt /marker.txt\n")
    spec = WorkspaceSpec(
        image="roll-async/test-built:1", dockerfile=good / "Dockerfile"
    )
    runtime_pool_free = DockerRuntime(DockerRuntimeConfig(pool_size=0))
    try:
        ws = await runtime_pool_free.start(spec)
        assert await ws.read_file("/marker.txt") == (good / "marker.txt").read_bytes()
        await ws.close()
        # another runtime (another run) finds the built image by the context's hash and builds nothing
        monkeypatch.setattr(docker_images, "_build", _no_build)
        again_runtime = DockerRuntime(DockerRuntimeConfig(pool_size=0))
        again = await again_runtime.start(spec)
        assert (
            await again.read_file("/marker.txt") == (good / "marker.txt").read_bytes()
        )
        await again_runtime.shutdown()
        monkeypatch.undo()
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "Dockerfile").write_text(f"FROM {IMAGE}\nRUN exit 7\n")
        with pytest.raises(WorkspaceError, match="fix the Dockerfile"):
            await runtime_pool_free.start(
                WorkspaceSpec(
                    image="roll-async/test-bad:1", dockerfile=bad / "Dockerfile"
                )
            )
    finally:
        await runtime_pool_free.shutdown()
        # the built image (its context holds a fresh marker, so every run builds one): both tags
        built = f"{docker_images.CONTEXT_REPO}:{docker_images.context_hash(good / 'Dockerfile')[:24]}"
        for tag in (built, spec.image):
            api.remove_image(tag)
    assert runtime_pool_free.containers() == 0


def test_no_daemon_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(
        WorkspaceError, match="no Docker daemon answers at unix:///nonexistent"
    ) as info:
        DockerRuntime()
    assert "docker_setup.sh" in str(info.value) and "\n" not in str(info.value)


#: A process playing two swe episodes on the docker runtime they share (one agent command running, a warm
#: container waiting), until a signal ends it: a driver or env worker mid-episode.
HOLDER = """
import asyncio, sys
from roll_async.envs import make_env

async def main():
    config = {
        "runtime": "docker",
        "runtime_config": {"run_id": sys.argv[1], "pool_size": 1},
        "action_format": "text",
        "task_format": "swe",
        "task_ids": ["roll-async__calc_add"],
    }
    envs = [make_env("swe", config) for _ in range(2)]
    for env in envs:
        await env.reset(0)
    busy = asyncio.ensure_future(envs[0].step("```bash\\nsleep 300\\n```"))
    await asyncio.sleep(0.3)  # the command runs: the episode is mid-way
    print("ready", flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def _holder(run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, run_id],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def _ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)
    assert line == "ready\n", f"the holder process failed (exit {process.poll()})"


async def test_killed_and_terminated_owners_leave_no_container(api: Any) -> None:
    killed_run, termed_run = (
        f"test-kill-{uuid.uuid4().hex[:8]}",
        f"test-term-{uuid.uuid4().hex[:8]}",
    )
    killed, termed = _holder(killed_run), _holder(termed_run)
    try:
        await asyncio.gather(_ready(killed), _ready(termed))
        # two episodes' containers, and the warm one when its refill has landed
        held = count_run(api, killed_run)
        assert held >= 2 and count_run(api, termed_run) >= 2
        # SIGTERM: the runtime's handler removes its containers before the process ends
        termed.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(termed.wait, 30) == -signal.SIGTERM
        assert count_run(api, termed_run) == 0
        # kill -9 mid-episode: nothing runs in the process; the next runtime's start-up reaper sweeps
        killed.send_signal(signal.SIGKILL)
        await asyncio.to_thread(killed.wait, 30)
        assert count_run(api, killed_run) >= held
        successor = DockerRuntime(DockerRuntimeConfig(pool_size=0))
        assert successor.reaped >= held
        assert count_run(api, killed_run) == 0
        await successor.shutdown()
    finally:
        for process in (killed, termed):
            if process.poll() is None:
                process.kill()
                process.wait()
