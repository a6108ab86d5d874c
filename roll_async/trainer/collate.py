"""Trajectories to training tensors: right-padded token tensors plus identifier lists.

Rollouts produce variable-length trajectories; the trainer computes per-token
losses over whole sequences, so this turns a batch of them into padded tensors,
keeping the group, weight-version and sampling information the loss needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from roll_async.errors import InvalidInputError
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.sampling import SamplingSettings
from roll_async.trajectory import Trajectory


@dataclass
class TrajectoryBatch:
    """A padded batch. Tensors are [batch, seq] except ``rewards``/``group_index`` ([batch]).

    For a trajectory of L tokens, row i holds ``input_ids[i, :L]`` (then
    ``pad_token_id``), ``attention_mask`` 1 on those L tokens, ``position_ids``
    0..L-1 (0 on padding), ``response_mask`` 1 on tokens the model generated,
    ``old_logprobs`` the engine's behaviour logprobs there (0 elsewhere), and
    ``rewards[i]`` the episode reward. ``group_index`` maps each row to a
    contiguous group number (0..num_groups-1, first appearance order) for
    group-relative advantages: one per (tag, group, role), so each seat of a
    game is compared with the same seat of its group's other games;
    identifiers come along as plain lists. Right padding, because training
    computes per-token losses over whole sequences.

    ``token_versions`` holds the weight version that sampled each generated
    token (-1 on prompt, env and padding tokens, and where a trajectory recorded
    none); ``policy_version`` is the version of the trainer's weights the batch is
    trained with (set by the pipeline), so ``trainer.max_token_lag`` can mask
    tokens sampled too many versions ago.

    ``sampling`` names the distribution the behaviour logprobs are of (the
    training rollouts' ``generation.*`` temperature / top_p / top_k); the trainer
    scores the batch under the same transformation (``roll_async.sampling``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_index: torch.Tensor
    #: [batch, seq] weight version per generated token, -1 elsewhere; None for hand-built batches.
    token_versions: torch.Tensor | None = None
    tags: list[str] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    episode_ids: list[int] = field(default_factory=list)
    env_ids: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    traj_ids: list[str] = field(default_factory=list)
    created_steps: list[int] = field(default_factory=list)
    stop_reasons: list[str] = field(default_factory=list)
    #: The sampling distribution of the behaviour logprobs (raw softmax at temperature 1 by default).
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    #: Weight version of the trainer's policy at this step; None: unknown (no token-lag masking).
    policy_version: int | None = None
    #: Each row's observation images in placeholder order (vision envs; empty lists otherwise).
    images: list[list[Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        tensors = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "response_mask": self.response_mask,
            "old_logprobs": self.old_logprobs,
            "rewards": self.rewards,
            "group_index": self.group_index,
        }
        if self.token_versions is not None:
            tensors["token_versions"] = self.token_versions
        return tensors

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        moved = {name: t.to(device) for name, t in self.tensors().items()}
        return TrajectoryBatch(
            **moved,
            tags=self.tags,
            group_ids=self.group_ids,
            episode_ids=self.episode_ids,
            env_ids=self.env_ids,
            seeds=self.seeds,
            traj_ids=self.traj_ids,
            created_steps=self.created_steps,
            stop_reasons=self.stop_reasons,
            sampling=self.sampling,
            policy_version=self.policy_version,
            images=self.images,
        )


def padding_token_id(tokenizer: ChatTokenizer | None) -> int:
    """The id to pad with: the tokenizer's pad token, else its EOS token, else 0.

    Padding is masked out of attention and loss, so any valid id serves; many
    published tokenizers (Llama-3.1's) define no pad token, and then EOS pads.
    """
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def collate_trajectories(
    trajectories: list[Trajectory],
    *,
    pad_token_id: int | None,
    pad_to: int | None = None,
    pad_to_multiple_of: int | None = None,
    sampling: SamplingSettings | None = None,
    policy_version: int | None = None,
) -> TrajectoryBatch:
    """Right-pad a batch; ``pad_to`` fixes the width (e.g. sequence_length) and must fit every trajectory.

    ``sampling``: the settings the trajectories were sampled with (default: temperature 1, no top-k/top-p);
    ``policy_version``: the trainer's weight version for this batch (enables ``trainer.max_token_lag``).
    ``pad_token_id=None`` pads with 0 (padding is masked; :func:`padding_token_id` picks the tokenizer's id).
    """
    if not trajectories:
        raise InvalidInputError("cannot collate an empty batch")
    for t in trajectories:
        if not (len(t.token_ids) == len(t.response_mask) == len(t.logprobs)):
            raise InvalidInputError(
                f"trajectory {t.traj_id}: token_ids ({len(t.token_ids)}), response_mask ({len(t.response_mask)}) "
                f"and logprobs ({len(t.logprobs)}) differ in length"
            )
        if t.token_versions and len(t.token_versions) != len(t.token_ids):
            raise InvalidInputError(
                f"trajectory {t.traj_id}: token_versions ({len(t.token_versions)}) and token_ids "
                f"({len(t.token_ids)}) differ in length"
            )
    longest = max(len(t.token_ids) for t in trajectories)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise InvalidInputError(
            f"pad_to={pad_to} is shorter than the longest trajectory ({longest} tokens)"
        )
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    width = max(width, 1)

    size = len(trajectories)
    pad = 0 if pad_token_id is None else int(pad_token_id)
    input_ids = torch.full((size, width), pad, dtype=torch.long)
    attention_mask = torch.zeros((size, width), dtype=torch.long)
    response_mask = torch.zeros((size, width), dtype=torch.long)
    old_logprobs = torch.zeros((size, width), dtype=torch.float32)
    token_versions = torch.full((size, width), -1, dtype=torch.long)
    for row, t in enumerate(trajectories):
        n = len(t.token_ids)
        if n == 0:
            continue
        input_ids[row, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        response_mask[row, :n] = torch.tensor(t.response_mask, dtype=torch.long)
        old_logprobs[row, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        if t.token_versions:
            token_versions[row, :n] = torch.tensor(t.token_versions, dtype=torch.long)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0) * attention_mask
    old_logprobs = old_logprobs * response_mask
    token_versions = token_versions.masked_fill(response_mask == 0, -1)

    # A game's seats are compared only with the same seat in the group's other games (role-conditioned
    # advantages): a seat with a built-in edge would otherwise look better than its opponent every game.
    group_numbers: dict[tuple[str, int, str], int] = {}
    group_index = torch.tensor(
        [
            group_numbers.setdefault((t.tag, t.group_id, t.role), len(group_numbers))
            for t in trajectories
        ],
        dtype=torch.long,
    )
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        response_mask=response_mask,
        old_logprobs=old_logprobs,
        rewards=torch.tensor(
            [t.episode_reward for t in trajectories], dtype=torch.float32
        ),
        group_index=group_index,
        token_versions=token_versions,
        tags=[t.tag for t in trajectories],
        group_ids=[t.group_id for t in trajectories],
        episode_ids=[t.episode_id for t in trajectories],
        env_ids=[t.env_id for t in trajectories],
        seeds=[t.seed for t in trajectories],
        traj_ids=[t.traj_id for t in trajectories],
        created_steps=[t.created_step for t in trajectories],
        stop_reasons=[t.stop_reason for t in trajectories],
        sampling=sampling or SamplingSettings(),
        policy_version=policy_version,
        images=[list(t.images) for t in trajectories],
    )
