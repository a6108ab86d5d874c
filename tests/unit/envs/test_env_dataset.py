"""Env-config datasets: parquet round trip, the CLI entry, and rows that rebuild the same envs."""

from __future__ import annotations

import argparse

import pyarrow.parquet as pq
import pytest

from roll_async.envs.dataset import (
    EnvDatasetRow,
    add_arguments,
    load_env_dataset,
    main,
    make_env_dataset_rows,
    write_env_dataset,
)


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_round_trip(tmp_path):
    rows = make_env_dataset_rows(
        "sokoban",
        5,
        seed=1,
        split="val",
        env_config={"dim_room": [7, 7], "num_boxes": 2},
    )
    rows.append(
        EnvDatasetRow("countdown", {"num_numbers": 3}, 42, "train", "my_source")
    )
    path = write_env_dataset(tmp_path / "sub" / "envs.parquet", rows)
    assert load_env_dataset(path) == rows


def test_columns_match_the_vagen_layout(tmp_path):
    path = write_env_dataset(
        tmp_path / "d.parquet",
        make_env_dataset_rows("frozen_lake", 2, env_config={"size": 5}),
    )
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "extra_info"]
    first = table.to_pylist()[0]
    assert first["data_source"] == "frozen_lake" and first["prompt"] == [
        {"role": "user", "content": ""}
    ]
    assert set(first["extra_info"]) == {"env_name", "env_config", "seed", "split"}


def test_seeds_are_distinct_and_reproducible():
    a = make_env_dataset_rows("countdown", 64, seed=0)
    assert len({r.seed for r in a}) == 64
    assert [r.seed for r in a] == [
        r.seed for r in make_env_dataset_rows("countdown", 64, seed=0)
    ]
    assert {r.seed for r in a} != {
        r.seed for r in make_env_dataset_rows("countdown", 64, seed=1)
    }


def test_cli_writes_a_loadable_fixed_validation_set(tmp_path, capsys):
    out = tmp_path / "sokoban_val.parquet"
    rc = main(
        cli(
            "--env",
            "sokoban",
            "--num",
            "4",
            "--seed",
            "0",
            "--split",
            "val",
            "--out",
            str(out),
            "--env-config",
            '{"dim_room": [6, 6]}',
        )
    )
    assert rc == 0 and "wrote 4 sokoban rows" in capsys.readouterr().out
    rows = load_env_dataset(out)
    assert [r.split for r in rows] == ["val"] * 4 and rows[0].env_config == {
        "dim_room": [6, 6]
    }
    # Each row rebuilds the same env state every time it is loaded.
    first = [r.make_env().reset(r.seed)[0] for r in rows]
    assert first == [r.make_env().reset(r.seed)[0] for r in load_env_dataset(out)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "nope"], "unknown env_type"),
        (["--env", "sokoban", "--env-config", '{"bad": 1}'], "'bad'"),
        (["--env", "sokoban", "--env-config", "[1]"], "JSON object"),
        (["--env", "sokoban", "--num", "0"], "num"),
    ],
)
def test_cli_bad_input_returns_2_with_reason(tmp_path, capsys, argv, message):
    assert main(cli(*argv, "--out", str(tmp_path / "x.parquet"))) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="make-env-dataset"):
        load_env_dataset(tmp_path / "none.parquet")
