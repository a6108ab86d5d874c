"""The fsdp2 trainer's KL reference snapshot survives a checkpoint at another world size, and the SFT warm start runs on ranks.

A resumed run must anchor its KL term to the same reference: after an SFT warm
start that is a snapshot of the warmed-up weights, which the DCP checkpoint
holds; reloading model.path's weights instead would change every KL value.
"""

from __future__ import annotations

import dataclasses

import pytest

from roll_async.config.schema import TrainerConfig
from roll_async.testing.spawned_ranks import run_on_ranks
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.sft import SFTExample, run_sft
from tests.unit.trainer.test_trainer_grpo import make_batch

pytestmark = pytest.mark.slow

CONFIG = TrainerConfig(
    device="cpu", lr=1e-3, micro_batch_size=2, kl_coef=0.05, strategy="fsdp2"
)


def snapshot_then_save(info, model_path, batch, save_dir):
    trainer = GRPOTrainer(
        dataclasses.replace(CONFIG, num_ranks=2), model_path, rank=info
    )
    trainer.train_step(batch, 0)
    trainer.reset_reference()  # as after an SFT warm start: the reference is now these weights
    trainer.train_step(batch, 1)
    trainer.save_checkpoint(save_dir, {"step": 1})
    return trainer.train_step(batch, 2)["train/kl"]


def resumed_kl(info, model_path, batch, save_dir):
    trainer = GRPOTrainer(
        dataclasses.replace(CONFIG, num_ranks=1), model_path, rank=info
    )
    trainer.load_checkpoint(save_dir)
    assert trainer.reference_source == "snapshot"
    return trainer.train_step(batch, 2)["train/kl"]


def test_the_kl_reference_snapshot_resumes_at_another_world_size(
    tiny_model_path, tokenizer, tmp_path
):
    batch = make_batch(tokenizer)
    save_dir = tmp_path / "step_1"
    expected = run_on_ranks(snapshot_then_save, 2, tiny_model_path, batch, save_dir)[0]
    assert expected > 0
    (resumed,) = run_on_ranks(resumed_kl, 1, tiny_model_path, batch, save_dir)
    assert resumed == pytest.approx(expected, rel=1e-4, abs=1e-7)


def examples(tokenizer) -> list[SFTExample]:
    prompt = tokenizer("Push the box.", add_special_tokens=False)["input_ids"]
    reply = tokenizer("<answer>Up</answer><|im_end|>", add_special_tokens=False)[
        "input_ids"
    ]
    return [
        SFTExample(
            input_ids=prompt + reply,
            loss_mask=[0] * len(prompt) + [1] * len(reply),
            seed=i,
            num_turns=1,
            demo_turns=1,
            success=True,
        )
        for i in range(4)
    ]


def sft_losses(info, model_path, demos):
    config = (
        CONFIG if info is not None else dataclasses.replace(CONFIG, strategy="single")
    )
    trainer = GRPOTrainer(
        dataclasses.replace(config, num_ranks=info.world_size if info else 1),
        model_path,
        rank=info,
    )
    return run_sft(trainer, demos, steps=3, lr=1e-3, batch_size=4)


def test_the_sft_warm_start_on_two_ranks_follows_the_single_process_run(
    tiny_model_path, tokenizer
):
    demos = examples(tokenizer)
    single = sft_losses(None, tiny_model_path, demos)
    ranks = run_on_ranks(sft_losses, 2, tiny_model_path, demos)
    for metrics in ranks:
        assert metrics["sft/loss/first"] == pytest.approx(
            single["sft/loss/first"], abs=1e-5
        )
        assert metrics["sft/loss/last"] == pytest.approx(
            single["sft/loss/last"], abs=1e-3
        )
        assert metrics["sft/loss/last"] < metrics["sft/loss/first"]
