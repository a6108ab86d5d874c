"""Write the shipped shell-agent tasks in both formats: Harbor task directories and SWE-bench-style JSONL rows.

The env must work offline with no download, and both loaders need tasks to test against, so the
bank of :mod:`.task_bank` and :mod:`.task_bank_shell` is written out here, byte-for-byte the same
every time: ``harbor/<name>/`` (task.toml, instruction.md, environment/Dockerfile FROM
``roll-async/swe-base:1`` with the starting files in environment/workspace, tests/test.sh with the
hidden pytest file, solution/solve.sh) and ``swe/tasks.jsonl`` with ``swe/repos/<name>`` snapshots,
the hidden tests as a ``test_patch`` and the reference fix as a git ``patch``. ``roll-async
make-env-dataset --env swe`` writes them next to its parquet; ``shipped_tasks_dir()`` keeps one
copy in the user's cache for configs that name no tasks.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from roll_async.envs.swe.task_bank import PYTHON_TASKS, BankTask
from roll_async.envs.swe.task_bank_shell import SHELL_TASKS
from roll_async.envs.swe.task_spec import BASE_IMAGE
from roll_async.errors import OutputExistsError

#: Bumped whenever the written files change shape, so a cached copy is rewritten.
FORMAT_VERSION = 1
SHIPPED_TASKS: tuple[BankTask, ...] = PYTHON_TASKS + SHELL_TASKS
_EOF = "ROLL_ASYNC_EOF"
_PYTEST_INI = "[pytest]\n"


def _start_tree(task: BankTask) -> dict[str, tuple[str, int]]:
    """path -> (content, mode) before the fix."""
    return {
        path: (text, task.modes.get(path, 0o644)) for path, text in task.files.items()
    }


def _fixed_tree(task: BankTask) -> dict[str, tuple[str, int]]:
    """path -> (content, mode) after the reference fix."""
    tree = _start_tree(task)
    for path, text in task.fixed.items():
        tree[path] = (text, tree.get(path, ("", 0o644))[1])
    for old, new in task.renames.items():
        tree[new] = tree.pop(old)
    for path in task.executable:
        tree[path] = (tree[path][0], 0o755)
    return tree


def solve_script(task: BankTask) -> str:
    """The reference fix as a bash script run in the working directory (Harbor's solution/solve.sh)."""
    lines = ["#!/bin/bash", f"# Reference solution of {task.name}.", "set -e"]
    for path, text in sorted(task.fixed.items()):
        lines.append(f"cat > '{path}' <<'{_EOF}'\n{text.rstrip(chr(10))}\n{_EOF}")
    for old, new in sorted(task.renames.items()):
        lines.append(f"mv '{old}' '{new}'")
    for path in task.executable:
        lines.append(f"chmod +x '{path}'")
    return "\n".join(lines) + "\n"


def hidden_test_script(task: BankTask) -> str:
    """tests/test.sh: pytest on the hidden file, isolated from the agent's pytest config, conftest and cwd modules."""
    return (
        "#!/bin/bash\n"
        f"# Hidden tests of {task.name}: the verifier runs this after the agent's turn, as its own user.\n"
        "# TESTS_DIR is where the verifier put this folder (Harbor's default: /tests); -P keeps the\n"
        "# working directory off sys.path until pytest itself is imported, -c and --noconftest ignore\n"
        "# any pytest config or conftest.py the agent wrote.\n"
        'TESTS_DIR="${TESTS_DIR:-/tests}"\n'
        'exec python3 -P -m pytest -c "$TESTS_DIR/pytest.ini" --rootdir="$PWD" -o "pythonpath=$PWD" \\\n'
        "  -p no:cacheprovider --noconftest -q "
        '${ROLL_ASYNC_PYTEST_PLUGIN:+-p "$ROLL_ASYNC_PYTEST_PLUGIN"} '
        f'"$TESTS_DIR/{task.test_file}"\n'
    )


def task_toml(task: BankTask) -> str:
    """task.toml with Harbor's sections and field names (see ``harbor.HARBOR_FIELDS``)."""
    tags = ["python", "pytest"] if task.category == "python_bug" else ["bash", "shell"]
    return (
        'version = "1.0"\n\n'
        "[metadata]\n"
        'author_name = "roll-async"\n'
        'difficulty = "easy"\n'
        f'category = "{task.category}"\n'
        f"tags = {json.dumps(tags)}\n"
        "roll_async_summary = true\n\n"
        "[verifier]\ntimeout_sec = 60.0\n\n"
        "[agent]\ntimeout_sec = 300.0\n\n"
        "[environment]\n"
        "build_timeout_sec = 600.0\n"
        "cpus = 1\n"
        "memory_mb = 1024\n"
        "storage_mb = 256\n"
        "allow_internet = false\n"
    )


def dockerfile() -> str:
    return f"FROM {BASE_IMAGE}\nWORKDIR /workspace\nCOPY workspace/ /workspace/\n"


def git_diff(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]
) -> str:
    """A git-format patch (``git apply`` takes it) from one tree of (content, mode) to another."""
    out: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        out.append(f"diff --git a/{path} b/{path}\n")
        if old is None:
            assert new is not None
            out.append(f"new file mode 100{new[1]:o}\n")
        elif new is None:
            out.append(f"deleted file mode 100{old[1]:o}\n")
        elif old[1] != new[1]:
            out.append(f"old mode 100{old[1]:o}\nnew mode 100{new[1]:o}\n")
        if old is not None and new is not None and old[0] == new[0]:
            continue
        lines = list(
            difflib.unified_diff(
                old[0].splitlines(keepends=True) if old else [],
                new[0].splitlines(keepends=True) if new else [],
                fromfile=f"a/{path}" if old else "/dev/null",
                tofile=f"b/{path}" if new else "/dev/null",
                lineterm="\n",
            )
        )
        out.extend(lines)
    return "".join(out)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def write_harbor_task(task: BankTask, root: Path) -> Path:
    """One Harbor task directory under ``root``."""
    folder = root / task.name
    _write(folder / "task.toml", task_toml(task))
    _write(folder / "instruction.md", task.instruction + "\n")
    _write(folder / "environment" / "Dockerfile", dockerfile())
    for path, (text, mode) in _start_tree(task).items():
        _write(folder / "environment" / "workspace" / path, text, mode)
    _write(folder / "tests" / "test.sh", hidden_test_script(task), 0o755)
    _write(folder / "tests" / "pytest.ini", _PYTEST_INI)
    _write(folder / "tests" / task.test_file, task.tests)
    _write(folder / "solution" / "solve.sh", solve_script(task), 0o755)
    return folder


def swe_row(task: BankTask, repo_path: str) -> dict[str, str]:
    """The task as a SWE-bench-style row (test ids and lists as JSON text, as SWE-bench stores them)."""
    test_path = f"tests/{task.test_file}"
    return {
        "instance_id": f"roll-async__{task.name}",
        "repo_path": repo_path,
        "image": BASE_IMAGE,
        "problem_statement": task.instruction,
        "test_patch": git_diff({}, {test_path: (task.tests, 0o644)}),
        "patch": git_diff(_start_tree(task), _fixed_tree(task)),
        "FAIL_TO_PASS": json.dumps(
            [f"{test_path}::{name}" for name in task.fail_to_pass]
        ),
        "PASS_TO_PASS": json.dumps(
            [f"{test_path}::{name}" for name in task.pass_to_pass]
        ),
    }


def write_task_set(
    out: str | Path, tasks: tuple[BankTask, ...] = SHIPPED_TASKS
) -> Path:
    """Write ``tasks`` under ``out`` (a new or empty folder): ``harbor/<name>/`` and ``swe/tasks.jsonl`` + ``swe/repos/``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise OutputExistsError(
            f"{out} already holds files; give a new or empty folder"
        )
    for task in tasks:
        write_harbor_task(task, out / "harbor")
        for path, (text, mode) in _start_tree(task).items():
            _write(out / "swe" / "repos" / task.name / path, text, mode)
    rows = [swe_row(task, f"repos/{task.name}") for task in tasks]
    _write(
        out / "swe" / "tasks.jsonl",
        "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows),
    )
    return out


def _fingerprint() -> str:
    first = SHIPPED_TASKS[0]
    text = repr(
        (
            FORMAT_VERSION,
            SHIPPED_TASKS,
            hidden_test_script(first),
            task_toml(first),
            dockerfile(),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def shipped_tasks_dir() -> Path:
    """The shipped set written once into the user's cache (keyed by its content) and reused."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    target = cache / "roll_async" / "swe_tasks" / _fingerprint()
    if (target / "swe" / "tasks.jsonl").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="staging.", dir=target.parent))
    write_task_set(staging)
    try:
        staging.rename(target)
    except OSError:  # another process wrote it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m roll_async.envs.swe.shipped --out DIR``: write the shipped set."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--out", required=True, help="a new or empty folder")
    args = parser.parse_args(argv)
    try:
        out = write_task_set(args.out)
    except OutputExistsError as exc:
        print(f"shipped: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(SHIPPED_TASKS)} tasks (harbor/ and swe/) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
