"""Env-config datasets: a parquet file with one row per env instance, as VAGEN writes them.

A fixed file of (env, config, seed) rows makes a validation set that stays the
same across runs and machines; ``roll-async make-env-dataset`` writes one.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from roll_async.envs.registry import make_env, resolve_env_class
from roll_async.errors import (
    DatasetError,
    InvalidInputError,
    InvalidTypeError,
    MissingFileError,
)

SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        (
            "prompt",
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
        ),
        (
            "extra_info",
            pa.struct(
                [
                    ("env_name", pa.string()),
                    ("env_config", pa.string()),
                    ("seed", pa.int64()),
                    ("split", pa.string()),
                ]
            ),
        ),
    ]
)


@dataclass
class EnvDatasetRow:
    """One env instance: build it with ``make_env(env_name, env_config)`` and ``reset(seed)``."""

    env_name: str
    env_config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    split: str = "train"
    data_source: str = ""

    def make_env(self) -> Any:
        return make_env(self.env_name, self.env_config)


def make_env_dataset_rows(
    env_name: str,
    num: int,
    seed: int = 0,
    split: str = "train",
    env_config: dict[str, Any] | None = None,
    data_source: str | None = None,
) -> list[EnvDatasetRow]:
    """``num`` rows with distinct seeds drawn from ``seed``; the env config is checked by building the env once.

    An env over a fixed set of problems (``math``) may fill its config from the
    split (``dataset_env_config``) and report ``num_tasks``: the seeds are then
    distinct modulo it, so up to ``num_tasks`` rows are distinct problems.
    """
    if num < 1:
        raise InvalidInputError(f"num must be >= 1, got {num}")
    env_config = dict(env_config or {})
    env = make_env(env_name, env_config)
    split_hook = getattr(type(env), "dataset_env_config", None)
    if split_hook is not None:
        _close(env)
        env_config = split_hook(env_config, split)
        env = make_env(env_name, env_config)
    num_tasks = getattr(env, "num_tasks", None)
    _close(env)
    modulo = num_tasks if isinstance(num_tasks, int) and 0 < num <= num_tasks else None
    rng = np.random.default_rng(seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < num:
        s = int(rng.integers(0, 2**31 - 1))
        key = s % modulo if modulo else s
        if key not in seen:
            seen.add(key)
            seeds.append(s)
    return [
        EnvDatasetRow(env_name, dict(env_config), s, split, data_source or env_name)
        for s in seeds
    ]


def _close(env: Any) -> None:
    """Close an env built only to check its config (an ``async def close`` is run to completion)."""
    result = env.close() if callable(getattr(env, "close", None)) else None
    if inspect.isawaitable(result):
        asyncio.run(_await(result))


async def _await(awaitable: Any) -> Any:
    return await awaitable


def write_env_dataset(path: str | Path, rows: list[EnvDatasetRow]) -> Path:
    """Write rows as parquet (parent folders are created).

    A fixed file of (env, config, seed) rows makes a validation set that stays the
    same across runs and machines. Columns:

    - ``data_source`` (string): where the row came from, by default the env name;
    - ``prompt`` (list of ``{role, content}``): an empty user message, a placeholder
      for trainers that expect a prompt column; the env writes the real prompt;
    - ``extra_info`` (struct): ``env_name``, ``env_config`` (JSON text, because
      configs differ in shape from env to env), ``seed`` (int64), ``split``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(
        [
            {
                "data_source": r.data_source or r.env_name,
                "prompt": [{"role": "user", "content": ""}],
                "extra_info": {
                    "env_name": r.env_name,
                    "env_config": json.dumps(r.env_config, sort_keys=True),
                    "seed": int(r.seed),
                    "split": r.split,
                },
            }
            for r in rows
        ],
        schema=SCHEMA,
    )
    pq.write_table(table, path)
    return path


def load_env_dataset(path: str | Path) -> list[EnvDatasetRow]:
    """Rows back from a file written by :func:`write_env_dataset` (or by VAGEN, whose env_config is a struct)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"env dataset {path} does not exist; write one with `roll-async make-env-dataset`"
        )
    table = pq.read_table(path)
    if "extra_info" not in table.column_names:
        raise DatasetError(
            f"{path} has no extra_info column; columns: {table.column_names}"
        )
    sources = (
        table.column("data_source").to_pylist()
        if "data_source" in table.column_names
        else None
    )
    rows = []
    for i, info in enumerate(table.column("extra_info").to_pylist()):
        cfg = info.get("env_config") or {}
        if isinstance(cfg, str):
            cfg = json.loads(cfg)
        name = info["env_name"]
        rows.append(
            EnvDatasetRow(
                name,
                dict(cfg),
                int(info["seed"]),
                str(info.get("split") or ""),
                (sources[i] if sources else None) or name,
            )
        )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``roll-async make-env-dataset``."""
    parser.add_argument(
        "--env",
        required=True,
        help="registered env name, package.module:ClassName, or gymnasium:/textarena:/reasoning_gym: id",
    )
    parser.add_argument(
        "--num", type=int, default=64, help="number of env instances (rows)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed from which the rows' seeds are drawn"
    )
    parser.add_argument(
        "--split",
        default="train",
        help="split name stored in each row (e.g. train, val)",
    )
    parser.add_argument("--out", required=True, help="output parquet path")
    parser.add_argument(
        "--env-config",
        default="{}",
        help="env config as a JSON object, e.g. '{\"dim_room\": [6, 6]}'",
    )
    parser.add_argument(
        "--data-source", default=None, help="data_source column (default: the env name)"
    )


def main(args: argparse.Namespace) -> int:
    """Write the dataset; a bad env name or config prints the reason and returns 2."""
    try:
        env_config = json.loads(args.env_config)
        if not isinstance(env_config, dict):
            raise InvalidTypeError(
                f"--env-config must be a JSON object, got {args.env_config!r}"
            )
        # an env whose tasks live in files (swe) writes them next to the parquet and names them in its config
        files_hook = getattr(resolve_env_class(args.env), "dataset_files", None)
        if files_hook is not None:
            env_config = files_hook(env_config, Path(args.out))
        rows = make_env_dataset_rows(
            args.env, args.num, args.seed, args.split, env_config, args.data_source
        )
    # json.JSONDecodeError is a ValueError; OSError: the task files could not be written (a folder in the way)
    except (ValueError, TypeError, OSError) as e:
        print(f"make-env-dataset: {e}", file=sys.stderr)
        return 2
    out = write_env_dataset(args.out, rows)
    print(f"wrote {len(rows)} {args.env} rows (split {args.split}) to {out}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(
        prog="roll-async make-env-dataset", description=__doc__.splitlines()[0]
    )
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
