"""The Workspace contract, checked on every runtime in ``RUNTIMES`` (local and docker) this host can start.

A runtime passes when commands run in the workdir with a timeout and an output cap, files written
by root survive links the agent planted, the agent cannot write outside its workspace or reach the
network, its processes can be killed, and closing leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roll_async.errors import ConfigError, UnsupportedHostError, WorkspaceError
from roll_async.testing.workspace_runtimes import (
    RUNTIMES,
    leftovers,
    owners,
    runtime_config,
    skip_reason,
)
from roll_async.workspaces import factory, local
from roll_async.workspaces.factory import make_runtime
from roll_async.workspaces.interface import Workspace, WorkspaceRuntime, WorkspaceSpec

#: docker starts a container per workspace: its half is in the slow tier (.ci/run runs it, with a daemon)
RUNTIME_PARAMS = [
    pytest.param(kind, marks=pytest.mark.slow) if kind == "docker" else kind
    for kind in RUNTIMES
]


@pytest.fixture(params=RUNTIME_PARAMS)
async def runtime(request: pytest.FixtureRequest) -> AsyncIterator[WorkspaceRuntime]:
    reason = skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    built = make_runtime(request.param, runtime_config(request.param))
    yield built
    await built.shutdown()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    return tmp_path


@pytest.fixture
async def workspace(runtime: WorkspaceRuntime, files: Path) -> AsyncIterator[Workspace]:
    ws = await runtime.start(
        WorkspaceSpec(image="roll-async/swe-base:1", files=files, disk_mb=32)
    )
    yield ws
    await ws.close()


async def test_commands_run_in_the_workdir_with_the_task_files(
    workspace: Workspace,
) -> None:
    assert isinstance(workspace, Workspace)
    result = await workspace.exec(
        "cat pkg/mod.py && ./run.sh && python3 -c 'print(6 * 7)'", timeout_s=20
    )
    assert (result.exit_code, result.timed_out, result.truncated) == (
        0,
        False,
        False,
    ), result.output
    assert result.output.split() == ["VALUE", "=", "1", "ran", "42"]
    failed = await workspace.exec("exit 3", timeout_s=10)
    assert failed.exit_code == 3


async def test_files_written_by_one_command_are_there_for_the_next(
    workspace: Workspace,
) -> None:
    await workspace.exec(
        "echo kept > note.txt && cd pkg && echo lost-cwd", timeout_s=10
    )
    result = await workspace.exec("cat note.txt && pwd", timeout_s=10)
    assert result.output.splitlines()[0] == "kept"
    assert not result.output.splitlines()[1].endswith("/pkg"), (
        "each command starts in the workdir"
    )


async def test_a_command_past_its_timeout_is_ended(workspace: Workspace) -> None:
    result = await workspace.exec("echo before; sleep 30", timeout_s=1)
    assert result.timed_out and result.exit_code is None
    assert "before" in result.output and result.seconds < 10


async def test_output_is_cut_keeping_head_and_tail(workspace: Workspace) -> None:
    result = await workspace.exec(
        "echo HEAD; head -c 200000 /dev/zero | tr '\\0' x; echo; echo TAIL",
        timeout_s=20,
    )
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("HEAD") and result.output.rstrip().endswith("TAIL")
    assert "bytes of output cut" in result.output and len(result.output) < 8000


async def test_the_agent_writes_only_its_workspace_and_has_no_network(
    workspace: Workspace,
) -> None:
    result = await workspace.exec(
        'touch /etc/roll_async_probe || echo no-etc; touch "$HOME/x" && echo home-ok; '
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" || echo no-net",
        timeout_s=20,
    )
    assert "no-etc" in result.output and "no-net" in result.output
    assert not Path("/etc/roll_async_probe").exists()


async def test_write_file_replaces_a_link_instead_of_following_it(
    workspace: Workspace, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    await workspace.exec(
        f"ln -s {outside} target.txt && mkdir -p d && ln -s {tmp_path} d/sub",
        timeout_s=10,
    )
    await workspace.write_file("target.txt", b"new\n")
    await workspace.write_file("d/sub/inner.txt", b"inner\n")
    assert outside.read_text() == "untouched\n"
    assert not (tmp_path / "inner.txt").exists()
    assert await workspace.read_file("target.txt") == b"new\n"
    assert await workspace.read_file("/workspace/d/sub/inner.txt") == b"inner\n"
    result = await workspace.exec("cat target.txt d/sub/inner.txt", timeout_s=10)
    assert result.output.split() == ["new", "inner"]


async def test_read_file_refuses_links_and_missing_files(workspace: Workspace) -> None:
    await workspace.exec("ln -s /etc/passwd pw", timeout_s=10)
    with pytest.raises(WorkspaceError):
        await workspace.read_file("pw")
    with pytest.raises(WorkspaceError):
        await workspace.read_file("no/such/file")
    with pytest.raises(WorkspaceError):
        await workspace.read_file("../../etc/passwd")


async def test_copy_in_a_folder(workspace: Workspace, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    (source / "a" / "b.txt").write_text("b\n")
    await workspace.copy_in(source, "copied")
    result = await workspace.exec("cat copied/a/b.txt", timeout_s=10)
    assert result.output == "b\n"


async def test_root_commands_run_as_another_user_that_owns_the_files(
    workspace: Workspace,
) -> None:
    agent = (await workspace.exec("id -u", timeout_s=10)).output.strip()
    root = await workspace.exec(
        "id -u; stat -c %u pkg/mod.py; echo v > by_root.txt", timeout_s=10, user="root"
    )
    assert root.exit_code == 0, root.output
    uid, owner = root.output.split()
    assert uid != agent and owner == uid
    again = await workspace.exec(
        "id -u; echo a >> by_root.txt && cat by_root.txt", timeout_s=10
    )
    assert again.output.split() == [agent, "v", "a"], (
        "files go back to the agent with its next command"
    )


async def test_kill_agent_processes_and_close_leave_nothing(
    runtime: WorkspaceRuntime, files: Path
) -> None:
    ws = await runtime.start(
        WorkspaceSpec(image="roll-async/swe-base:1", files=files, disk_mb=16)
    )
    identity = owners(ws)
    await ws.exec(
        "(setsid sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 & echo started",
        timeout_s=10,
    )
    await ws.kill_agent_processes()
    await ws.close()
    await ws.close()
    assert leftovers(identity) == []
    with pytest.raises(WorkspaceError):
        await ws.exec("true", timeout_s=5)


async def test_the_disk_is_limited_to_the_spec(
    runtime: WorkspaceRuntime, files: Path
) -> None:
    ws = await runtime.start(
        WorkspaceSpec(image="roll-async/swe-base:1", files=files, disk_mb=8)
    )
    try:
        result = await ws.exec(
            "for i in 1 2 3 4; do head -c 4000000 /dev/zero > f$i || echo full; done; du -sm .",
            timeout_s=20,
        )
        assert "full" in result.output
        assert int(result.output.split()[-2]) <= 9
    finally:
        await ws.close()


def test_a_host_without_namespaces_is_refused_naming_docker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local, "host_problem", lambda: "root (running as uid 1000)")
    with pytest.raises(UnsupportedHostError, match="runtime: docker"):
        make_runtime("local")


def test_the_docker_runtime_is_imported_lazily_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        factory, "DOCKER_MODULE", "roll_async.workspaces.no_such_runtime"
    )
    with pytest.raises(UnsupportedHostError, match="runtime: local"):
        make_runtime("docker")
    with pytest.raises(ConfigError, match="podman"):
        make_runtime("podman")


def test_local_runtime_config_names_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="max_output_bytes"):
        local.local_config({"max_ouput_bytes": 1})


@pytest.mark.skipif(skip_reason("local") is not None, reason=str(skip_reason("local")))
def test_a_new_local_runtime_removes_the_workspaces_of_dead_runs(
    tmp_path: Path,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    root = tmp_path / "root"
    stale = root / f"{dead.pid}-abc" / "ws"
    stale.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(stale)], check=True
    )
    (stale / "left.txt").write_text("x")
    alive = root / f"{os.getpid()}-def"
    alive.mkdir()
    make_runtime("local", {"root": str(root)})
    assert not stale.parent.exists() and alive.exists()
    assert str(stale) not in Path("/proc/self/mountinfo").read_text()
