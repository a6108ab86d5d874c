"""logging.save_batches files: the collated batch round-trips field by field; unknown fields are reported, not fatal."""

from __future__ import annotations

import dataclasses

import torch

from roll_async.trainer.batch_dump import load_batch, save_batch, saved_steps
from roll_async.trainer.collate import collate_trajectories
from roll_async.trajectory import Trajectory


def _batch():
    trajectories = [
        Trajectory(
            tag="T",
            group_id=g,
            episode_id=i,
            env_id=i,
            seed=1,
            traj_id=f"T-g{g}-e{i}",
            created_step=2,
            token_ids=list(range(3 + i)),
            response_mask=[0] * 2 + [1] * (1 + i),
            logprobs=[0.0] * 2 + [-0.5] * (1 + i),
            episode_reward=float(i),
            oldest_weight_version=1,
            newest_weight_version=2,
        )
        for g in range(2)
        for i in range(2)
    ]
    return trajectories, collate_trajectories(trajectories, pad_token_id=0)


def test_saved_batch_loads_back_identical(tmp_path):
    trajectories, batch = _batch()
    save_batch(tmp_path / "batches", 3, batch, trajectories)
    assert list(saved_steps(tmp_path)) == [3]
    step, loaded = load_batch(saved_steps(tmp_path)[3])
    assert step == 3
    for f in dataclasses.fields(batch):
        original, restored = getattr(batch, f.name), getattr(loaded, f.name)
        if isinstance(original, torch.Tensor):
            assert torch.equal(original, restored), f.name
        else:
            assert original == restored, f.name
    assert (
        torch.load(saved_steps(tmp_path)[3], weights_only=True)["weight_versions"]
        == [[1, 2]] * 4
    )


def test_fields_unknown_to_this_version_are_skipped_with_a_warning(tmp_path, caplog):
    _, batch = _batch()
    path = save_batch(tmp_path, 0, batch)
    payload = torch.load(path, weights_only=True)
    payload["batch"]["future_field"] = torch.zeros(1)
    torch.save(payload, path)
    _, loaded = load_batch(path)
    assert torch.equal(loaded.input_ids, batch.input_ids)
    assert "future_field" in caplog.text
