"""Group-relative advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from roll_async.trainer.advantages import (
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
)

# Rows interleave groups on purpose: group membership comes from group_index, not from order.
REWARDS = torch.tensor([1.0, 1.0, 0.0, 2.0, 0.0, 5.0])
GROUPS = torch.tensor([0, 1, 0, 1, 0, 2])


def test_grpo_normalised_matches_hand_computation():
    # group 0 = [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3); group 1 = [1, 2]: mean 1.5, std sqrt(0.5); group 2 alone.
    s0, s1 = math.sqrt(1 / 3), math.sqrt(0.5)
    expected = [(2 / 3) / s0, -0.5 / s1, (-1 / 3) / s0, 0.5 / s1, (-1 / 3) / s0, 0.0]
    got = grpo_advantages(REWARDS, GROUPS, normalize_std=True, eps=0.0)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_grpo_without_std_is_mean_centred():
    expected = [2 / 3, -0.5, -1 / 3, 0.5, -1 / 3, 0.0]
    got = compute_advantages(REWARDS, GROUPS, "grpo", normalize_std=False)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_rloo_leave_one_out_baseline():
    # group 0: 1 - (0+0)/2, 0 - (1+0)/2, 0 - (1+0)/2; group 1: 1 - 2, 2 - 1; group 2 alone: 0.
    expected = [1.0, -1.0, -0.5, 1.0, -0.5, 0.0]
    got = rloo_advantages(REWARDS, GROUPS)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    # normalize_std does not apply to rloo
    assert compute_advantages(
        REWARDS, GROUPS, "rloo", normalize_std=True
    ).tolist() == pytest.approx(expected)


def test_single_member_group_and_equal_rewards_give_zero():
    rewards = torch.tensor([3.0, 7.0, 7.0, 7.0])
    groups = torch.tensor([0, 1, 1, 1])
    for estimator in ("grpo", "rloo"):
        assert compute_advantages(rewards, groups, estimator).tolist() == [
            0.0,
            0.0,
            0.0,
            0.0,
        ]


def test_eps_bounds_tiny_std_and_dtype_is_kept():
    rewards = torch.tensor([1.0, 1.0 + 1e-9], dtype=torch.float32)
    got = grpo_advantages(rewards, torch.tensor([0, 0]), eps=1e-6)
    assert got.dtype == torch.float32
    assert torch.isfinite(got).all() and got.abs().max() < 1.0


def test_unknown_estimator_and_bad_shapes_raise():
    with pytest.raises(ValueError, match="unknown"):
        compute_advantages(REWARDS, GROUPS, "ppo")
    with pytest.raises(ValueError, match="same shape"):
        compute_advantages(REWARDS, GROUPS[:3])
