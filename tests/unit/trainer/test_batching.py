"""collate_trajectories: padding, masks, positions, logprobs, rewards and identifiers."""

from __future__ import annotations

import pytest
import torch

from roll_async.trainer.collate import collate_trajectories
from roll_async.trajectory import Trajectory


def trajectory(
    group_id: int, token_ids, response_mask, logprobs, reward: float, tag: str = "t"
) -> Trajectory:
    return Trajectory(
        tag=tag,
        group_id=group_id,
        episode_id=0,
        env_id=group_id * 10,
        seed=100 + group_id,
        traj_id=f"{tag}-{group_id}",
        created_step=3,
        token_ids=list(token_ids),
        response_mask=list(response_mask),
        logprobs=list(logprobs),
        episode_reward=reward,
        stop_reason="terminated",
    )


def test_right_padded_tensors_and_masks():
    a = trajectory(0, [11, 12, 13, 14], [0, 0, 1, 1], [0.0, 0.0, -0.1, -0.2], 1.0)
    b = trajectory(0, [21, 22], [0, 1], [0.0, -0.3], 0.0)
    c = trajectory(1, [31, 32, 33], [0, 1, 0], [0.0, -0.4, 0.0], 0.5, tag="u")
    batch = collate_trajectories([a, b, c], pad_token_id=0)
    assert batch.input_ids.tolist() == [
        [11, 12, 13, 14],
        [21, 22, 0, 0],
        [31, 32, 33, 0],
    ]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0], [0, 1, 2, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [0, 1, 0, 0]]
    assert torch.allclose(
        batch.old_logprobs,
        torch.tensor([[0, 0, -0.1, -0.2], [0, -0.3, 0, 0], [0, -0.4, 0, 0]]),
    )
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.group_index.tolist() == [0, 0, 1]
    assert (
        batch.tags == ["t", "t", "u"]
        and batch.seeds == [100, 100, 101]
        and batch.created_steps == [3, 3, 3]
    )
    assert (
        batch.input_ids.dtype == torch.long
        and batch.old_logprobs.dtype == torch.float32
    )
    assert len(batch) == 3 and set(batch.tensors()) >= {
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "old_logprobs",
        "rewards",
    }


def test_fixed_width_and_multiple_of():
    a = trajectory(0, [1, 2, 3], [0, 1, 1], [0, -1, -1], 0.0)
    assert collate_trajectories([a], pad_token_id=9, pad_to=8).input_ids.tolist() == [
        [1, 2, 3, 9, 9, 9, 9, 9]
    ]
    assert collate_trajectories(
        [a], pad_token_id=9, pad_to_multiple_of=4
    ).input_ids.shape == (1, 4)
    with pytest.raises(ValueError, match="shorter than the longest"):
        collate_trajectories([a], pad_token_id=9, pad_to=2)


def test_same_group_id_in_different_tags_are_different_groups():
    a = trajectory(5, [1], [1], [-1], 0.0, tag="x")
    b = trajectory(5, [1], [1], [-1], 0.0, tag="y")
    assert collate_trajectories([a, b], pad_token_id=0).group_index.tolist() == [0, 1]


def test_inconsistent_trajectory_is_refused():
    bad = trajectory(0, [1, 2], [0], [0.0, 0.0], 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        collate_trajectories([bad], pad_token_id=0)
    with pytest.raises(ValueError, match="empty"):
        collate_trajectories([], pad_token_id=0)


def test_to_moves_tensors_and_keeps_identifiers():
    a = trajectory(0, [1, 2], [0, 1], [0.0, -1.0], 1.0)
    moved = collate_trajectories([a], pad_token_id=0).to("cpu")
    assert moved.traj_ids == ["t-0"] and moved.input_ids.device.type == "cpu"


def test_token_versions_policy_version_and_sampling_travel_with_the_batch():
    from roll_async.sampling import SamplingSettings

    a = trajectory(0, [11, 12, 13, 14], [0, 0, 1, 1], [0.0, 0.0, -0.1, -0.2], 1.0)
    a.token_versions = [-1, -1, 3, 4]
    b = trajectory(
        0, [21, 22], [0, 1], [0.0, -0.3], 0.0
    )  # recorded no versions: unknown (-1)
    settings = SamplingSettings(0.7, 0.9, -1)
    batch = collate_trajectories(
        [a, b], pad_token_id=0, sampling=settings, policy_version=5
    )
    assert batch.token_versions.tolist() == [[-1, -1, 3, 4], [-1, -1, -1, -1]]
    moved = batch.to("cpu")
    assert (
        moved.policy_version == 5
        and moved.sampling == settings
        and moved.token_versions is not None
    )
    a.token_versions = [3]
    with pytest.raises(ValueError, match="token_versions"):
        collate_trajectories([a], pad_token_id=0)
