"""The envs of one worker process share one workspace runtime per kind, settings and event loop.

The first lease starts it, the last release shuts it down; other settings or another loop get another
runtime; a runtime that cannot start leaves nothing registered. A recording runtime stands in for the
real ones (the factory is what ``acquire_runtime`` calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from roll_async.errors import ConfigError
from roll_async.workspaces import shared
from roll_async.workspaces.interface import Workspace, WorkspaceSpec


class RecordingRuntime:
    """Counts its shutdowns; starts nothing."""

    kind = "local"

    def __init__(self, config: Mapping[str, Any] | None) -> None:
        self.config = dict(config or {})
        self.shutdowns = 0

    async def start(self, spec: WorkspaceSpec) -> Workspace:
        raise AssertionError("not started in these tests")

    def alive(self) -> int:
        return 0

    async def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[RecordingRuntime]:
    made: list[RecordingRuntime] = []

    def make(kind: str, config: Mapping[str, Any] | None = None) -> RecordingRuntime:
        if kind != "local":
            raise ConfigError(f"runtime={kind!r} is not one of ['docker', 'local']")
        made.append(RecordingRuntime(config))
        return made[-1]

    monkeypatch.setattr(shared, "make_runtime", make)
    return made


async def test_leases_share_one_runtime_until_the_last_release(
    built: list[RecordingRuntime],
) -> None:
    first = shared.acquire_runtime("local", {"root": "/a"})
    second = shared.acquire_runtime("local", {"root": "/a"})
    other = shared.acquire_runtime("local", {"root": "/b"})
    assert first.runtime is second.runtime and other.runtime is not first.runtime
    assert len(built) == 2 and shared.shared_runtimes() == 2
    await first.release()
    await first.release()  # idempotent: still one user
    assert built[0].shutdowns == 0
    await second.release()
    await other.release()
    assert [r.shutdowns for r in built] == [1, 1] and shared.shared_runtimes() == 0
    again = shared.acquire_runtime("local", {"root": "/a"})
    assert again.runtime is not first.runtime  # a fresh one after the last release
    await again.release()


def test_another_loop_gets_its_own_runtime_and_a_failed_start_leaves_nothing(
    built: list[RecordingRuntime],
) -> None:
    async def lease() -> shared.RuntimeLease:
        return shared.acquire_runtime("local", None)

    one = asyncio.run(lease())
    two = asyncio.run(lease())
    # the first loop closed with its lease held: its entry is dropped, not handed to the second loop
    assert one.runtime is not two.runtime and shared.shared_runtimes() == 1
    asyncio.run(two.release())
    assert shared.shared_runtimes() == 0

    async def bad() -> None:
        shared.acquire_runtime("podman", None)

    with pytest.raises(ConfigError, match="podman"):
        asyncio.run(bad())
    assert shared.shared_runtimes() == 0
