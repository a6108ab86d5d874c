"""benchmarks/precision_curve.py: the run order alternates, and a run's metrics.jsonl reads back into its curve."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.precision_curve import (
    comparison,
    median_curves,
    run_dir_name,
    run_order,
    summarise_run,
    train_command,
)


def test_runs_alternate_precision_first_seed_by_seed():
    assert run_order([1, 2, 3]) == [
        (1, "float32"),
        (1, "bfloat16"),
        (2, "bfloat16"),
        (2, "float32"),
        (3, "float32"),
        (3, "bfloat16"),
    ]


def test_the_two_runs_of_a_seed_differ_only_in_param_dtype(tmp_path):
    a = train_command("configs/default.yaml", "float32", 7, None, tmp_path, ["x=1"])
    b = train_command("configs/default.yaml", "bfloat16", 7, None, tmp_path, ["x=1"])
    assert [w for w in a if w not in b] == ["trainer.param_dtype=float32"]
    assert "seed=7" in a and f"output_dir={tmp_path}" in a


def _write_run(path, successes, val=None):
    path.mkdir(parents=True)
    rows = [{"step": -1, "sft/steps": 40.0}]
    for step, s in enumerate(successes):
        row = {
            "step": step,
            "env/Lake/success": s,
            "rollout/episode_reward/mean": s - 0.1,
            "train/importance_ratio/mean": 1.0,
            "train/grad_norm": 0.2,
            "time/step_total": 3.0,
        }
        if val and step in val:
            row["val/Lake/success"] = val[step]
        rows.append(row)
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_a_run_reads_back_into_its_summary(tmp_path):
    _write_run(tmp_path / "r", [0.0, 0.1, 0.2, 0.5, 0.4, 0.6], val={2: 0.25, 5: 0.5})
    res = summarise_run(tmp_path / "r", k=2, wall_s=12.0)
    s = res["summary"]
    assert res["curve"]["step"] == [0, 1, 2, 3, 4, 5]
    assert s["success_first_k"] == pytest.approx(0.05)
    assert s["success_last_k"] == pytest.approx(0.5)
    assert (s["success_final"], s["success_best"]) == (0.6, 0.6)
    assert s["val_success"] == {"2": 0.25, "5": 0.5}
    assert s["val_success_final"] == 0.5
    assert s["train_loop_s"] == pytest.approx(18.0)


def test_medians_over_seeds_per_precision(tmp_path):
    curves = {
        ("float32", 1): [0.0, 0.2],
        ("float32", 2): [0.2, 0.6],
        ("bfloat16", 1): [0.1, 0.3],
        ("bfloat16", 2): [0.1, 0.5],
    }
    runs = {}
    for (dtype, seed), succ in curves.items():
        name = run_dir_name(dtype, seed)
        _write_run(tmp_path / name, succ)
        runs[name] = summarise_run(tmp_path / name, k=1, wall_s=1.0)
    med = median_curves(runs, [1, 2])
    assert med["float32"]["success"] == pytest.approx([0.1, 0.4])
    assert med["bfloat16"]["success"] == pytest.approx([0.1, 0.4])
    cmp_ = comparison(runs, [1, 2])
    assert cmp_["bfloat16"]["success_best"] == pytest.approx(0.4)
    # no validation: the figure is left out, not NaN
    assert "val_success_final" not in cmp_["float32"]
    assert not any(math.isnan(v) for c in cmp_.values() for v in c.values())


def test_the_grad_check_splits_a_batch_by_whole_groups():
    import torch

    from benchmarks.precision_grad_check import _subset
    from roll_async.trainer.collate import TrajectoryBatch

    n = 6
    ids = torch.arange(n * 3).reshape(n, 3)
    batch = TrajectoryBatch(
        input_ids=ids,
        attention_mask=torch.ones(n, 3, dtype=torch.long),
        position_ids=torch.arange(3).repeat(n, 1),
        response_mask=torch.ones(n, 3, dtype=torch.long),
        old_logprobs=torch.zeros(n, 3),
        rewards=torch.arange(n, dtype=torch.float32),
        group_index=torch.tensor([0, 1, 2, 0, 1, 2]),
        traj_ids=[f"t{i}" for i in range(n)],
    )
    first = batch.group_index < 2
    a, b = _subset(batch, first), _subset(batch, ~first)
    assert a.traj_ids == ["t0", "t1", "t3", "t4"] and b.traj_ids == ["t2", "t5"]
    assert a.group_index.tolist() == [0, 1, 0, 1]
    assert b.group_index.tolist() == [0, 0]  # renumbered from 0
    assert torch.equal(b.input_ids, ids[[2, 5]])
    assert len(a) == 4 and a.rewards.tolist() == [0.0, 1.0, 3.0, 4.0]
