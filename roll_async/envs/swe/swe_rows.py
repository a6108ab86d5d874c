"""Load SWE-bench-style rows (JSONL or parquet, one task per row) into :class:`TaskSpec` s.

SWE-bench, SWE-Gym and their kin ship tasks as rows: an instance id, the issue text, the repository
(a prepared image, or a repo at a base commit), a ``test_patch`` that adds the hidden tests, and the
test ids that must go from failing to passing (``FAIL_TO_PASS``) or keep passing
(``PASS_TO_PASS``). Column names differ between datasets, so each is configurable like the math
env's; a missing column fails naming the env_config key, the column and the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from roll_async.envs.math_tasks import _read_rows
from roll_async.envs.swe.task_spec import BASE_IMAGE, TaskSpec
from roll_async.errors import ConfigError, DatasetError

#: Where repositories named by ``repo`` + ``base_commit`` are unpacked, once per (repo, commit).
SNAPSHOT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    / "roll_async"
    / "swe_snapshots"
)


@dataclass(frozen=True)
class SweColumns:
    """The column holding each field (``custom_envs.<Tag>.env_config.columns`` overrides any of them).

    A row needs a repository: ``repo_path`` (a snapshot folder, relative to the file's folder or
    absolute), ``repo`` + ``base_commit`` (a local git repository, unpacked at that commit), or only
    ``image`` (the docker runtime's image holds the repository).
    """

    instance_id: str = "instance_id"
    problem_statement: str = "problem_statement"
    test_patch: str = "test_patch"
    fail_to_pass: str = "FAIL_TO_PASS"
    pass_to_pass: str = "PASS_TO_PASS"
    repo_path: str = "repo_path"
    repo: str = "repo"
    base_commit: str = "base_commit"
    image: str = "image"
    patch: str = "patch"


def swe_columns(overrides: dict[str, str] | None) -> SweColumns:
    """:class:`SweColumns` with ``overrides`` applied; an unknown field names the accepted ones."""
    accepted = [f.name for f in fields(SweColumns)]
    unknown = [k for k in overrides or {} if k not in accepted]
    if unknown:
        raise ConfigError(
            f"env_config.columns key {unknown[0]!r} is not a row field; accepted: {', '.join(accepted)}"
        )
    return SweColumns(**{k: str(v) for k, v in (overrides or {}).items()})


def _test_ids(value: Any, column: str, row: int, path: Path) -> tuple[str, ...]:
    """A list of test ids, given as a list or as JSON text of one (SWE-bench stores them as text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError as exc:
            raise DatasetError(
                f"{path}: row {row} column {column!r} is not a JSON list of test ids: {exc}"
            ) from exc
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, str) for v in value
    ):
        raise DatasetError(
            f"{path}: row {row} column {column!r} must be a list of test ids"
        )
    return tuple(value)


def snapshot_repo(repo: str, commit: str) -> Path:
    """A folder with ``repo`` (a local git repository) at ``commit``, unpacked once into :data:`SNAPSHOT_CACHE`."""
    if not (Path(repo) / ".git").exists() and not Path(repo, "HEAD").is_file():
        raise DatasetError(
            f"repo {repo!r} is not a local git repository; the local runtime needs one (or a repo_path "
            "snapshot); with runtime: docker give the row an image that holds the repository"
        )
    key = hashlib.sha256(f"{Path(repo).resolve()}@{commit}".encode()).hexdigest()[:16]
    target = SNAPSHOT_CACHE / key
    if target.is_dir():
        return target
    SNAPSHOT_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=SNAPSHOT_CACHE))
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise DatasetError(
            f"git archive of {repo} at {commit} failed: {archive.stderr.decode(errors='replace').strip()}"
        )
    subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
    try:
        staging.rename(target)
    except OSError:  # made meanwhile by another process
        subprocess.run(["rm", "-rf", str(staging)], check=False)
    return target


def apply_patch_script(patch: str) -> str:
    """A bash script that applies ``patch`` in the working directory with ``git apply``."""
    marker = "ROLL_ASYNC_PATCH_" + hashlib.sha256(patch.encode()).hexdigest()[:12]
    return f"git apply --whitespace=nowarn <<'{marker}'\n{patch.rstrip(chr(10))}\n{marker}\n"


def load_swe_rows(
    path: str | Path, columns: SweColumns | None = None, image: str = BASE_IMAGE
) -> list[TaskSpec]:
    """Every row of a JSONL or parquet file as a :class:`TaskSpec` (``image`` when a row names none)."""
    path = Path(path).resolve()
    columns = columns or SweColumns()
    if not path.is_file():
        raise DatasetError(f"SWE task file {path} does not exist")
    try:
        names, rows = _read_rows(path)
    except ConfigError as exc:
        raise DatasetError(f"SWE task file {path}: {exc}") from exc
    required = (
        "instance_id",
        "problem_statement",
        "test_patch",
        "fail_to_pass",
        "pass_to_pass",
    )
    for name in required:
        column = getattr(columns, name)
        if column not in names:
            raise DatasetError(
                f"{path} has no column {column!r} (env_config.columns.{name}); columns: {', '.join(names)}"
            )
    tasks = []
    for i, row in enumerate(rows):
        files: Path | None = None
        snapshot = row.get(columns.repo_path)
        if snapshot:
            files = (path.parent / str(snapshot)).resolve()
            if not files.is_dir():
                raise DatasetError(
                    f"{path}: row {i} {columns.repo_path}={snapshot!r} is not a folder"
                )
        elif (
            row.get(columns.repo)
            and row.get(columns.base_commit)
            and not row.get(columns.image)
        ):
            files = snapshot_repo(str(row[columns.repo]), str(row[columns.base_commit]))
        elif not row.get(columns.image):
            raise DatasetError(
                f"{path}: row {i} names no repository: fill {columns.repo_path!r}, "
                f"{columns.repo!r} + {columns.base_commit!r}, or {columns.image!r}"
            )
        patch = row.get(columns.patch)
        tasks.append(
            TaskSpec(
                task_id=str(row[columns.instance_id]),
                format="swe",
                instruction=str(row[columns.problem_statement]).strip(),
                image=str(row.get(columns.image) or image),
                files=files,
                solution=apply_patch_script(str(patch)) if patch else None,
                test_patch=str(row[columns.test_patch]),
                fail_to_pass=_test_ids(
                    row[columns.fail_to_pass], columns.fail_to_pass, i, path
                ),
                pass_to_pass=_test_ids(
                    row[columns.pass_to_pass], columns.pass_to_pass, i, path
                ),
                summary_required=True,
            )
        )
    if not tasks:
        raise DatasetError(f"SWE task file {path} has no rows")
    return tasks
