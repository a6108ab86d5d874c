"""benchmarks.gpu_trainer: the shapes it trains, the figures it compares with, its time guard, and (slow) its CPU mode end to end."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import benchmarks.common as common
from benchmarks import gpu_trainer
from benchmarks.trainer_sizing import BY_NAME, size


@pytest.mark.parametrize("model", [m for m, _, _ in gpu_trainer.MODELS])
def test_the_random_models_have_the_published_architectures_parameter_counts(model):
    from transformers import AutoModelForCausalLM

    arch = BY_NAME[model]
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(gpu_trainer.qwen2_config(arch))
    assert sum(p.numel() for p in built.parameters()) == arch.total_params()
    assert abs(arch.total_params() / 1e9 - arch.published_total_b) < 0.01


@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_fsdp2_on_one_rank_is_sized_as_single_with_fsdp2s_gathered_units(tuning):
    arch = BY_NAME["Qwen2.5-1.5B"]
    one = size(arch, "fsdp2x1", "bf16", tuning)
    single = size(arch, "single", "bf16", tuning)
    two = size(arch, "fsdp2x2", "bf16", tuning)
    assert (one.param_shard, one.grad_shard, one.optim_shard) == (
        single.param_shard,
        single.grad_shard,
        single.optim_shard,
    )
    assert (one.param_working, one.grad_working) == (
        two.param_working,
        two.grad_working,
    )
    assert gpu_trainer.computed_bytes(arch, tuning, 4096) == one.total


def test_mfu_peaks_and_result_names_follow_the_device_name():
    assert gpu_trainer.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_trainer.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_trainer.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_trainer.peak_tflops("NVIDIA L4") is None
    assert gpu_trainer.peak_tflops(None) is None
    assert gpu_trainer.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_trainer.device_slug("NVIDIA H200") == "h200"
    assert gpu_trainer.device_slug(None) == "cpu"


def test_a_budget_too_short_for_any_model_records_every_model_as_skipped(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    assert gpu_trainer.main(["--cpu", "--budget-s", "5", "--name", "none"]) == 1
    rows = json.loads((tmp_path / "none.json").read_text())["rows"]
    assert [r["model"] for r in rows] == [m for m, _, _ in gpu_trainer.MODELS]
    assert all(r["status"].startswith("skipped") for r in rows)


def test_a_model_process_past_its_deadline_is_killed_and_its_last_state_kept(
    tmp_path, monkeypatch
):
    """A process stuck before its first step (a hung load, say) is killed at the deadline."""

    def stuck(args, model, out, deadline):
        state = json.dumps({"status": "building"})
        code = f"import time; open({str(out)!r}, 'w').write({state!r}); time.sleep(60)"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(gpu_trainer, "DEADLINE_MARGIN_S", 0.5)
    monkeypatch.setattr(gpu_trainer, "child_command", stuck)
    argv = ["--cpu", "--models", "Qwen2.5-0.5B", "--budget-s", "3", "--name", "stuck"]
    assert gpu_trainer.main(argv) == 1
    (row,) = json.loads((tmp_path / "stuck.json").read_text())["rows"]
    assert row["status"] == "building, killed at its 3 s deadline"
    assert row["wall_s"] < 10


@pytest.mark.slow
def test_the_cpu_mode_runs_every_model_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    assert gpu_trainer.main(["--cpu", "--name", "smoke"]) == 0
    result = json.loads((tmp_path / "smoke.json").read_text())
    rows = result["rows"]
    assert [r["model"] for r in rows] == [m for m, _, _ in gpu_trainer.MODELS]
    for row in rows:
        assert row["status"] == "done", row.get("error", row["status"])
        assert row["packed"] and row["micro_batches"] > 1
        assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 2
        assert all(math.isfinite(loss) for loss in row["losses"])
        assert row["peak_rss_bytes"] > 0 and row["computed_bytes"] > 0
        assert row["checkpoint_parameters"] == row["parameters"]
    assert rows[-1]["tuning"] == "lora"
    assert (
        rows[-1]["optimizer_bytes"] < rows[0]["optimizer_bytes"]
    )  # the adapters alone
    markdown = (tmp_path / "smoke.md").read_text()
    for column in (
        "tokens/s",
        "peak allocated GiB",
        "computed GiB",
        "host peak RSS GiB",
    ):
        assert column in markdown
    for row in rows:
        assert f"| {row['arch']} | {row['tuning']} |" in markdown
    assert "nothing here ran on a GPU" in markdown
