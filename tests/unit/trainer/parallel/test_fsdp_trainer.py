"""The fsdp2 trainer on two gloo CPU ranks: exact gradients against one process, half the bytes per rank, DCP resume at other world sizes.

The gradient check compares with a single-process run, not with another FSDP
run: FSDP2's reductions on gloo have summed where they should average (and the
reverse), which two FSDP runs would agree on.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.tensor import DTensor

from roll_async.config.schema import TrainerConfig
from roll_async.testing.spawned_ranks import run_on_ranks
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.parallel.process_group import RankInfo
from tests.unit.trainer.test_trainer_grpo import make_batch

pytestmark = pytest.mark.slow


def trainer_config(**overrides) -> TrainerConfig:
    base = dict(device="cpu", lr=1e-3, micro_batch_size=2, max_grad_norm=1.0)
    base.update(overrides)
    return TrainerConfig(**base)


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def adamw_first_step_bound(
    lr: float,
    grad_a: torch.Tensor,
    grad_b: torch.Tensor,
    eps: float = 1e-8,
    atol: float = 1e-6,
) -> torch.Tensor:
    """Elementwise bound on how far two runs' weights may differ after AdamW's first step from the same start.

    The first step moves each weight by ``lr * g / (|g| + eps)`` (bias-corrected moments: m = g, sqrt(v) = |g|),
    so gradients that agree to reduction noise can move an element whose ``|g|`` is near ``eps`` by up to ``lr``
    apart (the ratio swings between -1 and 1): a fixed tolerance fails on one CPU and not another. The bound is
    the step difference the two runs' own gradients give, plus ``atol`` for rounding; ``grad_a`` and ``grad_b``
    are the gradients each optimizer stepped with (after clipping). A run whose update is wrong exceeds it
    wherever its gradient is well above the noise.
    """

    def step(grad: torch.Tensor) -> torch.Tensor:
        return grad / (grad.abs() + eps)

    return lr * (step(grad_a) - step(grad_b)).abs() + atol


def in_one_process_and_on_two_ranks(
    fn, model_path, batch, config: TrainerConfig, timeout_s: float = 600.0
):
    """``fn`` in this process with ``config``, then on two fsdp2 ranks with the same config: (one, ranks)."""
    one = fn(None, model_path, batch, config)
    ranks = run_on_ranks(
        fn,
        2,
        model_path,
        batch,
        dataclasses.replace(config, strategy="fsdp2", num_ranks=2),
        timeout_s=timeout_s,
    )
    return one, ranks


def gradients(info: RankInfo | None, model_path, batch, config: TrainerConfig):
    """One accumulate_gradients pass: loss, token count and every parameter's full gradient."""
    trainer = GRPOTrainer(config, model_path, rank=info)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    stats = trainer.accumulate_gradients(batch, advantages)
    grads = {
        name: full(p.grad).detach().clone()
        for name, p in trainer.model.named_parameters()
        if p.grad is not None
    }
    return {"loss": stats.loss, "tokens": stats.num_tokens, "grads": grads}


def steps_and_memory(info: RankInfo | None, model_path, batch, config, save_dir):
    """Step 0, checkpoint, then steps 1 and 2: the losses a resumed run must repeat, and the bytes held."""
    trainer = GRPOTrainer(config, model_path, rank=info)
    trainer.train_step(batch, 0)
    memory = trainer.memory()
    trainer.save_checkpoint(save_dir, {"step": 0})
    losses = [trainer.train_step(batch, s)["train/loss"] for s in (1, 2)]
    return {"memory": memory, "losses": losses}


def resumed_losses(info: RankInfo | None, model_path, batch, config, save_dir):
    trainer = GRPOTrainer(config, model_path, rank=info)
    extra = trainer.load_checkpoint(save_dir)
    assert extra == {"step": 0}
    return [trainer.train_step(batch, s)["train/loss"] for s in (1, 2)]


@pytest.fixture(scope="module")
def batch(tokenizer):
    return make_batch(tokenizer)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "kl_coef": 0.05,
            "max_tokens_per_micro_batch": 128,
            "gradient_checkpointing": True,
        },
    ],
    ids=["padded", "packed+kl+checkpointing"],
)
def test_two_ranks_give_the_single_process_gradient(tiny_model_path, batch, overrides):
    single, ranks = in_one_process_and_on_two_ranks(
        gradients, tiny_model_path, batch, trainer_config(**overrides)
    )
    for result in ranks:
        assert result["loss"] == pytest.approx(single["loss"], abs=1e-5)
        assert result["tokens"] == single["tokens"]
    sharded = ranks[0]["grads"]
    assert set(sharded) == set(single["grads"])
    worst = max(float((sharded[n] - g).abs().max()) for n, g in single["grads"].items())
    assert worst < 1e-5, f"largest gradient difference {worst:.3g}"


def weights_built_without_reading_on_other_ranks(info: RankInfo, model_path, config):
    """Build a trainer with a KL reference where only the main rank may read the checkpoint."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError(f"rank {info.rank} read the checkpoint")

    if not info.is_main:
        PreTrainedModel.from_pretrained = classmethod(refuse)
    trainer = GRPOTrainer(config, model_path, rank=info)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {
        "policy": get_model_state_dict(trainer.model, options=options),
        "reference": get_model_state_dict(trainer.ref_model, options=options),
        "buffers": {n: b.clone() for n, b in trainer.model.named_buffers()},
        "tied": trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight,
    }


def test_only_the_main_rank_reads_the_checkpoint_and_every_rank_gets_its_weights(
    tiny_model_path,
):
    # Every rank reading the whole float32 model before sharding costs its full size in host RAM per
    # rank; the main rank reads it and sends the others their shards.
    config = trainer_config(strategy="fsdp2", num_ranks=2, kl_coef=0.05)
    ranks = run_on_ranks(
        weights_built_without_reading_on_other_ranks, 2, tiny_model_path, config
    )
    loaded = GRPOTrainer(trainer_config(), tiny_model_path).model
    expected = loaded.state_dict()
    buffers = dict(loaded.named_buffers())
    assert buffers  # rotary frequencies: not in the state dict, broadcast too
    for result in ranks:
        for name in ("policy", "reference"):
            if result[name]:  # cpu_offload: the full dict lands on the main rank
                assert set(result[name]) == set(expected)
                for key, tensor in expected.items():
                    assert torch.equal(result[name][key], tensor), (name, key)
        for key, tensor in buffers.items():
            assert torch.equal(result["buffers"][key], tensor), key
        assert result["tied"]
    assert ranks[0]["policy"] and ranks[0]["reference"]


def test_a_save_at_two_ranks_resumes_at_one_and_two_with_the_same_losses(
    tiny_model_path, batch, tmp_path
):
    config = dataclasses.replace(trainer_config(), strategy="fsdp2", num_ranks=2)
    save_dir = tmp_path / "step_0"
    first, second = run_on_ranks(
        steps_and_memory, 2, tiny_model_path, batch, config, save_dir
    )
    single = GRPOTrainer(trainer_config(), tiny_model_path)
    single.train_step(batch, 0)
    whole = single.memory()
    for rank in (first, second):
        for key in ("parameter_bytes", "optimizer_bytes"):
            assert rank["memory"][key] == pytest.approx(whole[key] / 2, rel=0.10), key
    expected = first["losses"]
    assert second["losses"] == pytest.approx(expected, abs=1e-6)

    again = run_on_ranks(resumed_losses, 2, tiny_model_path, batch, config, save_dir)
    assert again[0] == pytest.approx(expected, abs=1e-5)
    one_rank = run_on_ranks(
        resumed_losses,
        1,
        tiny_model_path,
        batch,
        dataclasses.replace(config, num_ranks=1),
        save_dir,
    )
    assert one_rank[0] == pytest.approx(expected, abs=1e-5)
    in_process = resumed_losses(
        None, tiny_model_path, batch, trainer_config(), save_dir
    )
    assert in_process == pytest.approx(expected, abs=1e-5)
    # the checkpoint is also a Hugging Face model directory (weights written layer by layer)
    assert (save_dir / "model.safetensors.index.json").is_file()
    assert (save_dir / "config.json").is_file()


def test_a_micro_batch_without_scored_tokens_on_one_rank_neither_hangs_nor_changes_the_gradient(
    tiny_model_path, batch
):
    # rows 0-1 (one micro-batch) have nothing to score: the rank that gets it skips it and the other
    # does not, so the ranks' per-pass totals differ in what they counted (a hang before the fix)
    tensors = batch.tensors()
    tensors["response_mask"] = tensors["response_mask"].clone()
    tensors["response_mask"][:2] = 0
    skewed = type(batch)(**tensors, traj_ids=batch.traj_ids)
    single, ranks = in_one_process_and_on_two_ranks(
        gradients, tiny_model_path, skewed, trainer_config(), timeout_s=180
    )
    assert ranks[0]["loss"] == pytest.approx(single["loss"], abs=1e-5)
    worst = max(
        float((ranks[0]["grads"][n] - g).abs().max())
        for n, g in single["grads"].items()
    )
    assert worst < 1e-5


def logprobs(info: RankInfo | None, model_path, batch, config: TrainerConfig):
    return GRPOTrainer(config, model_path, rank=info).compute_logprobs(batch)


def test_bf16_compute_on_two_ranks_scores_within_the_stated_tolerance_of_fp32(
    tiny_model_path, batch
):
    # FSDP2's MixedPrecisionPolicy gathers bf16 parameters over float32 masters; the trainer's
    # logprobs must stay within what docs/architecture.md states for bf16 (0.02 nats mean, 0.1 max)
    reference = logprobs(None, tiny_model_path, batch, trainer_config())
    config = trainer_config(strategy="fsdp2", num_ranks=2, param_dtype="bfloat16")
    sharded = run_on_ranks(logprobs, 2, tiny_model_path, batch, config)
    mask = batch.response_mask.bool().clone()
    mask[:, 0] = False
    for result in sharded:
        gap = (result - reference)[mask].abs()
        assert float(gap.mean()) < 0.02 and float(gap.max()) < 0.1
        assert float(gap.max()) > 0  # bf16 really ran
