"""The shipped shell-agent tasks and both task formats: written deterministically, parsed back, checked against Harbor.

HARBOR_MODEL below is Harbor's task model written down from its package source,
``src/harbor/models/task/config.py`` of laude-institute/harbor (read from the fork LegoX/harbor at
commit 73fd120e731217b38f31667932ea26a28cdd4fff): ``TaskConfig`` (version/schema_version, task,
metadata, verifier, agent, environment, solution, source), ``VerifierConfig``, ``AgentConfig``,
``EnvironmentConfig`` and ``SolutionConfig`` with their field types. Every shipped task.toml may use
only those fields, with values of those types.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll_async.cli import main
from roll_async.envs.dataset import load_env_dataset
from roll_async.envs.swe.harbor import (
    HARBOR_FIELDS,
    load_harbor_task,
    load_harbor_tasks,
)
from roll_async.envs.swe.shipped import SHIPPED_TASKS, write_task_set
from roll_async.envs.swe.swe_rows import load_swe_rows, snapshot_repo, swe_columns
from roll_async.errors import (
    ConfigError,
    DatasetError,
    MissingFileError,
    OutputExistsError,
)

#: Harbor's TaskConfig fields and their types (see the module docstring for the source).
HARBOR_MODEL: dict[str, dict[str, tuple[type, ...]]] = {
    "verifier": {
        "timeout_sec": (float, int),
        "env": (dict,),
        "user": (str, int),
        "network_mode": (str,),
        "allowed_hosts": (list,),
    },
    "agent": {
        "timeout_sec": (float, int),
        "user": (str, int),
        "network_mode": (str,),
        "allowed_hosts": (list,),
    },
    "environment": {
        "build_timeout_sec": (float, int),
        "docker_image": (str,),
        "cpus": (int,),
        "memory_mb": (int,),
        "storage_mb": (int,),
        "gpus": (int,),
        "gpu_types": (list,),
        "allow_internet": (bool,),
        "network_mode": (str,),
        "allowed_hosts": (list,),
        "mcp_servers": (list,),
        "env": (dict,),
        "skills_dir": (str,),
        "healthcheck": (dict,),
        "memory": (str,),
        "storage": (str,),
    },
    "solution": {"env": (dict,)},
}
HARBOR_TOP = {
    "version": (str,),
    "schema_version": (str,),
    "source": (str,),
    "task": (dict,),
    "metadata": (dict,),
}


@pytest.fixture(scope="module")
def task_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_set(tmp_path_factory.mktemp("swe") / "set")


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_at_least_30_tasks_in_both_formats_deterministically(
    task_set: Path, tmp_path: Path
) -> None:
    names = {t.name for t in SHIPPED_TASKS}
    assert len(names) == len(SHIPPED_TASKS) >= 30
    assert {t.category for t in SHIPPED_TASKS} == {"python_bug", "shell"}
    assert {p.name for p in (task_set / "harbor").iterdir()} == names
    assert len((task_set / "swe" / "tasks.jsonl").read_text().splitlines()) == len(
        names
    )
    again = write_task_set(tmp_path / "again")
    assert _tree(again) == _tree(task_set), "the same bank must write the same bytes"
    with pytest.raises(OutputExistsError):
        write_task_set(task_set)


def test_harbor_tasks_parse_with_harbors_fields(task_set: Path) -> None:
    tasks = load_harbor_tasks(task_set / "harbor")
    assert len(tasks) == len(SHIPPED_TASKS)
    for task in tasks:
        folder = task_set / "harbor" / task.task_id
        config = tomllib.loads((folder / "task.toml").read_text())
        for key, value in config.items():
            if key in HARBOR_TOP:
                assert isinstance(value, HARBOR_TOP[key]), (task.task_id, key)
                continue
            assert key in HARBOR_MODEL, (
                f"{task.task_id}: [{key}] is not a Harbor section"
            )
            for field, field_value in value.items():
                assert field in HARBOR_MODEL[key], (
                    f"{task.task_id}: [{key}] {field} is not a Harbor field"
                )
                assert isinstance(field_value, HARBOR_MODEL[key][field]), (
                    task.task_id,
                    key,
                    field,
                )
        assert {"verifier", "agent", "environment", "metadata"} <= set(config)
        assert (
            (folder / "environment" / "Dockerfile")
            .read_text()
            .startswith("FROM roll-async/swe-base:1\n")
        )
        assert task.instruction and task.solution and task.tests_dir is not None
        assert task.files is not None and any(task.files.iterdir())
        assert (
            task.summary_required
            and task.agent_timeout_s == 300
            and task.verifier_timeout_s == 60
        )
        assert task.storage_mb == 256 and task.memory_mb == 1024 and not task.network
    # the loader's accepted keys are the model's, so a task it accepts is one Harbor accepts
    assert {k: set(v) for k, v in HARBOR_FIELDS.items() if v is not None} == {
        k: set(v) for k, v in HARBOR_MODEL.items()
    }


def test_swe_rows_parse_from_jsonl_and_parquet(task_set: Path, tmp_path: Path) -> None:
    rows_path = task_set / "swe" / "tasks.jsonl"
    tasks = load_swe_rows(rows_path)
    assert len(tasks) == len(SHIPPED_TASKS)
    for task, bank in zip(tasks, SHIPPED_TASKS, strict=True):
        assert task.task_id == f"roll-async__{bank.name}" and task.format == "swe"
        assert task.fail_to_pass == tuple(
            f"tests/test_{bank.name}.py::{n}" for n in bank.fail_to_pass
        )
        assert task.files is not None and task.files.is_dir() and task.solution
        assert task.image == "roll-async/swe-base:1"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    renamed = [
        {("issue" if k == "problem_statement" else k): v for k, v in r.items()}
        for r in rows
    ]
    for row in renamed:
        row["repo_path"] = str(task_set / "swe" / row["repo_path"])
        row["FAIL_TO_PASS"] = json.loads(
            row["FAIL_TO_PASS"]
        )  # a list column works as well as JSON text
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(renamed), parquet)
    again = load_swe_rows(parquet, swe_columns({"problem_statement": "issue"}))
    assert [t.fail_to_pass for t in again] == [t.fail_to_pass for t in tasks]
    assert [t.instruction for t in again] == [t.instruction for t in tasks]


def test_a_missing_column_fails_naming_it(task_set: Path, tmp_path: Path) -> None:
    rows = [
        json.loads(line)
        for line in (task_set / "swe" / "tasks.jsonl").read_text().splitlines()
    ]
    for row in rows:
        del row["PASS_TO_PASS"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match="'PASS_TO_PASS'.*columns.pass_to_pass"):
        load_swe_rows(path)
    with pytest.raises(ConfigError, match="accepted"):
        swe_columns({"problem": "x"})


def test_a_row_from_a_git_repo_at_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "m.py").write_text("X = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    (repo / "m.py").write_text("X = 2\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    monkeypatch.setattr(
        "roll_async.envs.swe.swe_rows.SNAPSHOT_CACHE", tmp_path / "cache"
    )
    assert (snapshot_repo(str(repo), commit) / "m.py").read_text() == "X = 1\n"
    with pytest.raises(DatasetError, match="not a local git repository"):
        snapshot_repo(str(tmp_path / "nowhere"), commit)


@pytest.mark.parametrize("missing", ["instruction.md", "tests/test.sh", "task.toml"])
def test_a_harbor_task_without_a_required_file_names_it(
    task_set: Path, tmp_path: Path, missing: str
) -> None:
    folder = shutil.copytree(task_set / "harbor" / "calc_add", tmp_path / "calc_add")
    (folder / missing).unlink()
    with pytest.raises(MissingFileError) as info:
        load_harbor_task(folder)
    assert str(folder / missing) in str(info.value) and "\n" not in str(info.value)


def test_a_task_toml_key_harbor_does_not_know_is_named(
    task_set: Path, tmp_path: Path
) -> None:
    folder = shutil.copytree(task_set / "harbor" / "calc_add", tmp_path / "calc_add")
    toml = folder / "task.toml"
    toml.write_text(
        toml.read_text().replace("timeout_sec = 300.0", "timeout_secs = 300.0")
    )
    with pytest.raises(DatasetError, match="timeout_secs"):
        load_harbor_task(folder)
    toml.write_text(
        toml.read_text().replace("timeout_secs = 300.0", "timeout_sec = -1")
    )
    with pytest.raises(DatasetError, match="positive"):
        load_harbor_task(folder)


def test_make_env_dataset_writes_the_tasks_next_to_its_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data" / "swe.parquet"
    assert (
        main(["make-env-dataset", "--env", "swe", "--num", "8", "--out", str(out)]) == 0
    )
    assert "wrote 8 swe rows" in capsys.readouterr().out
    rows = load_env_dataset(out)
    assert len(rows) == 8 and len({r.seed % len(SHIPPED_TASKS) for r in rows}) == 8
    tasks_path = Path(rows[0].env_config["tasks_path"])
    assert tasks_path == (tmp_path / "data" / "swe_tasks" / "harbor").resolve()
    assert len(load_harbor_tasks(tasks_path)) == len(SHIPPED_TASKS)
