"""Test aids for workspace runtimes: which runtimes a test runs against, and what each leaves behind.

The contract tests (tests/unit/workspaces) and the red-team probes (tests/security/test_swe_probes.py)
run once per runtime in :data:`RUNTIMES` that this host can start, so the docker runtime joins them
by adding its kind here and a branch to :func:`leftovers`.
"""

from __future__ import annotations

import os
from typing import Any

from roll_async.errors import InvalidTypeError
from roll_async.workspaces.interface import Workspace
from roll_async.workspaces.local import LocalWorkspace, host_problem, pids_of

RUNTIMES: tuple[str, ...] = ("local",)


def skip_reason(kind: str) -> str | None:
    """Why runtime ``kind`` cannot start on this host (None: it can)."""
    if kind == "local":
        problem = host_problem()
        return f"local workspaces need {problem}" if problem else None
    return f"no containment check for runtime {kind!r} yet (add one to leftovers)"


def owners(workspace: Workspace) -> Any:
    """What identifies the workspace's processes and files, captured before it closes (local: its two uids)."""
    if isinstance(workspace, LocalWorkspace):
        return (workspace.agent_uid, workspace.verifier_uid, workspace.home)
    raise InvalidTypeError(f"no containment check for {type(workspace).__name__}")


def leftovers(identity: Any) -> list[str]:
    """What of a closed workspace is still there (processes, files), from :func:`owners`; empty when contained."""
    agent_uid, verifier_uid, home = identity
    left = [
        f"process {pid} of uid {uid}"
        for uid in (agent_uid, verifier_uid)
        for pid in pids_of(uid)
    ]
    if os.path.exists(home):
        left.append(f"folder {home}")
    return left
