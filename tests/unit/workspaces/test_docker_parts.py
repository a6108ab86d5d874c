"""The docker runtime's parts that need no daemon: the output cap, the config, the warm pool's bookkeeping,
the build context's hash and the reaper's judgement of a dead owner. The runtime against a real daemon is
tests/unit/workspaces/test_docker_runtime.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_async.errors import ConfigError
from roll_async.workspaces.docker import DockerRuntimeConfig, docker_config
from roll_async.workspaces.docker_exec import HeadTail, kill_marked, wrapped
from roll_async.workspaces.docker_images import _split, context_hash
from roll_async.workspaces.docker_pool import WarmPool, pool_key
from roll_async.workspaces.docker_reaper import (
    LABEL_HOST,
    LABEL_PID,
    LABEL_START,
    owner_alive,
    owner_labels,
    process_start_ticks,
)
from roll_async.workspaces.factory import make_runtime
from roll_async.workspaces.interface import WorkspaceSpec
from roll_async.workspaces.output_cap import CUT_MARKER, cut_middle


def test_head_tail_keeps_both_ends_of_a_long_stream_fed_in_pieces() -> None:
    data = b"".join(b"%06d\n" % i for i in range(20000))
    kept = HeadTail(1000)
    for start in range(0, len(data), 777):
        kept.add(data[start : start + 777])
    text, truncated = kept.text()
    assert truncated
    head, tail = data[:500].decode(), data[-500:].decode()
    assert text == head + CUT_MARKER.format(len(data) - 1000) + tail


def test_head_tail_under_the_cap_is_the_whole_output() -> None:
    kept = HeadTail(1000)
    for piece in (b"abc", b"\xff", b"def" * 100):
        kept.add(piece)
    whole = (b"abc\xff" + b"def" * 100).decode("utf-8", "replace")
    assert kept.text() == (whole, False)


def test_the_command_runs_under_a_group_killing_timeout() -> None:
    assert wrapped("echo hi", 2.5) == [
        "timeout",
        "-s",
        "KILL",
        "2.500",
        "bash",
        "-lc",
        "exec 2>&1\necho hi",
    ]
    assert wrapped("x", 0)[3] == "0.001"  # timeout 0 would mean no timeout at all
    assert "ROLL_ASYNC_EXEC=abc" in kill_marked("abc")[2]


def test_config_rejects_what_docker_cannot_use() -> None:
    with pytest.raises(ConfigError, match="agent_user='agent'"):
        DockerRuntimeConfig(agent_user="agent")
    with pytest.raises(ConfigError, match="pool_size=-1"):
        DockerRuntimeConfig(pool_size=-1)
    assert DockerRuntimeConfig(pool_size=0).pool_size == 0


def test_the_env_configs_runtime_config_builds_the_docker_config_naming_unknown_keys() -> (
    None
):
    config = docker_config({"run_id": "r1", "pool_size": 0, "file_size_mb": 8})
    assert (config.run_id, config.pool_size, config.file_size_mb) == ("r1", 0, 8)
    assert docker_config(None) == DockerRuntimeConfig()
    # the factory hands the mapping over: a typo fails before any daemon is asked
    with pytest.raises(
        ConfigError,
        match="'pool_sise' is not accepted by the docker runtime; accepted keys: run_id",
    ):
        make_runtime("docker", {"pool_sise": 1})


def test_one_cut_marker_for_both_runtimes() -> None:
    assert cut_middle(b"ab", b"", 2) == ("ab", False)
    assert cut_middle(b"ab", b"yz", 10) == ("ab" + CUT_MARKER.format(6) + "yz", True)
    kept = HeadTail(4)
    kept.add(b"abcdefghij")
    assert kept.text() == cut_middle(b"ab", b"ij", 10)


def test_a_pool_key_keeps_whether_files_come_not_which() -> None:
    with_files = pool_key(WorkspaceSpec(image="a", files=Path("/task/1")))
    assert with_files == pool_key(WorkspaceSpec(image="a", files=Path("/task/2")))
    assert with_files != pool_key(WorkspaceSpec(image="a"))
    assert (
        with_files.files is not None
        and pool_key(WorkspaceSpec(image="a")).files is None
    )


def test_image_names_split_into_repository_and_tag() -> None:
    assert _split("roll-async/swe-base:1") == ("roll-async/swe-base", "1")
    assert _split("localhost:5000/img") == ("localhost:5000/img", "latest")
    assert _split("img") == ("img", "latest")


def test_the_context_hash_follows_every_file_of_the_context(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM base\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    first = context_hash(dockerfile)
    assert context_hash(dockerfile) == first
    (tmp_path / "src" / "a.py").write_text("a = 2\n")
    assert context_hash(dockerfile) != first
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    assert context_hash(dockerfile) == first
    (tmp_path / "src" / "a.py").chmod(0o755)
    assert context_hash(dockerfile) != first


def test_a_dead_or_reused_pid_on_this_host_is_a_dead_owner() -> None:
    mine = owner_labels("run-x")
    assert owner_alive(mine)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_start_ticks(child.pid) is None
    assert not owner_alive({**mine, LABEL_PID: str(child.pid)})
    # the pid runs, but started at another time: a reused pid, so the owner died
    stale = int(mine[LABEL_START]) - 1
    assert not owner_alive({**mine, LABEL_START: str(stale)})
    # another host's owner is never judged from here
    assert owner_alive({**mine, LABEL_PID: str(child.pid), LABEL_HOST: "elsewhere"})
    assert mine[LABEL_PID] == str(os.getpid())


class FakeDocker:
    """Container ids from a counter, each creation taking ``delay`` seconds, and a record of removals."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.created: list[str] = []
        self.removed: list[str] = []

    async def create(self, spec: WorkspaceSpec) -> str:
        await asyncio.sleep(self.delay)
        self.created.append(f"c{len(self.created)}")
        return self.created[-1]

    async def remove(self, container_id: str) -> None:
        self.removed.append(container_id)


async def test_the_pool_misses_cold_then_hits_warm_per_spec() -> None:
    fake = FakeDocker()
    pool = WarmPool(2, fake.create, fake.remove)
    spec = WorkspaceSpec(image="a", files=Path("/task/1"))
    first, hit = await pool.take(spec)
    assert (first, hit) == ("c0", False)
    await pool.warm(spec)
    assert pool.idle() == 2
    # files are copied after the take, so another task's spec shares the pool
    assert pool_key(spec) == pool_key(WorkspaceSpec(image="a", files=Path("/task/2")))
    second, hit = await pool.take(WorkspaceSpec(image="a", files=Path("/task/2")))
    assert hit is True and second in ("c1", "c2")
    third, hit = await pool.take(WorkspaceSpec(image="a", memory_mb=64))
    assert hit is False  # other limits, another pool
    await pool.close()
    assert pool.idle() == 0
    # what was taken belongs to its workspace; every other container is removed
    assert sorted(set(fake.created) - set(fake.removed)) == sorted(
        {first, second, third}
    )


async def test_a_pool_closed_during_a_refill_removes_what_lands_later() -> None:
    fake = FakeDocker(delay=0.2)
    pool = WarmPool(3, fake.create, fake.remove)
    taken, _ = await pool.take(WorkspaceSpec(image="a"))
    await asyncio.sleep(0.05)  # a refill's creation is under way
    await pool.close()
    await asyncio.sleep(0.3)
    assert set(fake.created) - set(fake.removed) == {taken}
