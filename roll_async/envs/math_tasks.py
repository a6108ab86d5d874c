"""Read a user's math problems (parquet or JSONL, one per row) and fail early, naming the key, on bad input.

The math env builds its config once per env instance, and the config is where
a wrong ``data_path`` or column name must fail (so a config check catches it
before any actor starts), so the file is read here once per version of it and
cached; every error is one line naming the ``custom_envs.<Tag>.env_config`` key
and the fix.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from roll_async.envs.math_answers import reference_answer
from roll_async.envs.math_data import SHIPPED_TASKS
from roll_async.errors import ConfigError

#: Prefix of every error: the config does not know its tag, so the tag stays a placeholder.
ENV_CONFIG_KEY = "custom_envs.<Tag>.env_config"
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True)
class MathTask:
    """One problem and its reference answer (a bare expression, boxes and ``$`` removed)."""

    question: str
    answer: str


def load_math_tasks(
    data_path: str | None,
    question_key: str = "problem",
    answer_key: str = "answer",
    split: str = "all",
    split_key: str = "split",
) -> tuple[MathTask, ...]:
    """The problems of a parquet or JSONL file (cached per file version); bad input raises ConfigError."""
    path = Path(data_path) if data_path else SHIPPED_TASKS
    if not path.is_file():
        raise ConfigError(
            f"{ENV_CONFIG_KEY}.data_path={str(data_path)!r}: no such file; give a parquet or JSONL file with one problem "
            "per row, or leave data_path unset for the shipped arithmetic problems"
        )
    stat = path.stat()
    return _load_cached(
        str(path.resolve()),
        stat.st_mtime_ns,
        stat.st_size,
        question_key,
        answer_key,
        split,
        split_key,
    )


@functools.lru_cache(maxsize=16)
def _load_cached(
    path: str,
    mtime_ns: int,
    size: int,
    question_key: str,
    answer_key: str,
    split: str,
    split_key: str,
) -> tuple[MathTask, ...]:
    """Every env of a tag builds its config; the file is read once per version of it."""
    columns, rows = _read_rows(Path(path))
    needed = [("question_key", question_key), ("answer_key", answer_key)]
    if split != "all":
        needed.append(("split_key", split_key))
    for name, column in needed:
        if column not in columns:
            what = {
                "question_key": "the problem text",
                "answer_key": "the reference answer",
            }.get(name, f"the split names (or set {ENV_CONFIG_KEY}.split: all)")
            raise ConfigError(
                f"{ENV_CONFIG_KEY}.{name}={column!r} is not a column of {path} (columns: {', '.join(columns) or 'none'}); "
                f"set {name} to the column holding {what}"
            )
    if split != "all":
        names = sorted({str(r.get(split_key)) for r in rows})
        rows = [r for r in rows if str(r.get(split_key)) == split]
        if not rows:
            raise ConfigError(
                f"{ENV_CONFIG_KEY}.split={split!r}: {path} has no rows with {split_key}={split!r} "
                f"(its splits: {', '.join(names)}); use one of them or split: all"
            )
    tasks = []
    for i, row in enumerate(rows):
        question, answer = row.get(question_key), row.get(answer_key)
        for name, column, value in (
            ("question_key", question_key, question),
            ("answer_key", answer_key, answer),
        ):
            if value is None or not str(value).strip():
                raise ConfigError(
                    f"{ENV_CONFIG_KEY}.{name}={column!r}: row {i} of {path} has no value in that column; "
                    "fill it in or drop the row"
                )
        tasks.append(MathTask(str(question), reference_answer(str(answer))))
    if not tasks:
        raise ConfigError(
            f"{ENV_CONFIG_KEY}.data_path={path!r} has no rows; give a file with one problem per row"
        )
    return tuple(tasks)


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Column names and rows of a parquet or JSON-lines file (a JSON array of objects works too)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        table = pq.read_table(path)
        return list(table.column_names), table.to_pylist()
    if suffix not in _JSON_SUFFIXES:
        raise ConfigError(
            f"{ENV_CONFIG_KEY}.data_path={str(path)!r}: unknown file type {suffix or '(none)'!r}; "
            "use .parquet or .jsonl (one JSON object per line)"
        )
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = _json_or_error(text, path, "the file")
    else:
        rows = [
            _json_or_error(line, path, f"line {n}")
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(
            f"{ENV_CONFIG_KEY}.data_path={str(path)!r}: every row must be a JSON object"
        )
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns), rows


def _json_or_error(text: str, path: Path, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(
            f"{ENV_CONFIG_KEY}.data_path={str(path)!r}: {where} is not valid JSON ({e}); fix the file"
        ) from None
