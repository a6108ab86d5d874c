"""One task an agent solves in a shell, whichever format it came from (a Harbor task directory or a SWE-bench-style row).

The env, the verifier and the runtimes read only this record, so a new task format is one more
loader that fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

TaskFormat = Literal["harbor", "swe"]

#: The image every shipped task's Dockerfile starts FROM: python3 (3.11 or newer: the tests use ``-P``
#: and tomllib), git, pytest and bash.
BASE_IMAGE = "roll-async/swe-base:1"


@dataclass(frozen=True)
class TaskSpec:
    """What the agent starts from, what it is told, and how its work is checked.

    ``files``: the starting workspace on this host (a Harbor task's ``environment/workspace``, a
    row's repository snapshot), or None when only the image holds it. Harbor tasks are checked by
    ``tests_dir/test.sh``; SWE rows by applying ``test_patch`` and running ``fail_to_pass`` and
    ``pass_to_pass`` with pytest. ``solution`` is a bash script that solves the task (Harbor's
    ``solution/solve.sh``, or one that applies a row's gold ``patch``), for oracle checks.
    ``summary_required``: the tests report each outcome through the verifier's pytest plugin, and
    only that report (with the episode's nonce) can pass them, not a bare exit code 0.
    """

    task_id: str
    format: TaskFormat
    instruction: str
    image: str = BASE_IMAGE
    files: Path | None = None
    dockerfile: Path | None = None
    tests_dir: Path | None = None
    solution: str | None = None
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 120.0
    build_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 1024
    network: bool = False
    summary_required: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
