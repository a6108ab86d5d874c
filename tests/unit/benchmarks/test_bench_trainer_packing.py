"""benchmarks.trainer_packing: a small run writes its files with equal losses, and refuses to overwrite them."""

from __future__ import annotations

import json

import pytest

import benchmarks.common as common
from benchmarks import trainer_packing


def test_a_small_run_writes_equal_losses_and_refuses_to_overwrite(
    tmp_path, monkeypatch, tiny_model_path
):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    argv = ["--rows", "6", "--long-rows", "1", "--max-len", "64", "--repeats", "1"]
    argv += [
        "--short",
        "8",
        "16",
        "--prompt-len",
        "4",
        "--threads",
        "0",
        "--name",
        "small",
    ]
    assert trainer_packing.main(argv) == 0
    result = json.loads((tmp_path / "small.json").read_text())
    assert result["loss_equal"] and result["micro_batches"]["packed"] >= 1
    assert result["computed_positions"]["packed"] == result["real_tokens"]
    assert "Speed ratio padded / packed" in (tmp_path / "small.md").read_text()
    with pytest.raises(SystemExit, match="--overwrite"):
        trainer_packing.main(argv)
