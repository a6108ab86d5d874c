"""LoRA on fsdp2 ranks: the single-process LoRA gradient, adapters alone change, sync and checkpoint the adapter.

The frozen base is sharded like full fine-tuning; only the adapters train, go
to the engines (gathered whole: they are small) and into the checkpoint (DCP
of the trainable parameters plus the adapter as peft saves it), which resumes
at another world size and in one process.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)

from roll_async.config.schema import LoraConfig, TrainerConfig
from roll_async.testing.spawned_ranks import run_on_ranks
from roll_async.trainer import lora as lora_adapters
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.parallel.sharded_checkpoint import DCP_DIR
from tests.unit.trainer.parallel.test_fsdp_trainer import (
    adamw_first_step_bound,
    full,
    in_one_process_and_on_two_ranks,
)
from tests.unit.trainer.test_trainer_grpo import make_batch

pytestmark = pytest.mark.slow

CONFIG = TrainerConfig(
    device="cpu",
    lr=1e-2,
    micro_batch_size=2,
    max_grad_norm=1.0,
    kl_coef=0.05,
    lora=LoraConfig(rank=8),
)
SHARDED = dataclasses.replace(CONFIG, strategy="fsdp2", num_ranks=2)


def random_adapter(model_path) -> dict[str, torch.Tensor]:
    """Random A and B (peft starts B at 0, which would make the adapter a no-op)."""
    trainer = GRPOTrainer(CONFIG, model_path)
    generator = torch.Generator().manual_seed(0)
    return {
        name: torch.randn(p.shape, generator=generator) * 0.1
        for name, p in trainer.model.named_parameters()
        if ".lora_" in name
    }


def train_and_save(info, model_path, batch, config, adapter, save_dir):
    """Gradients of one pass, a step (base before/after), the engine's adapter, a save, then one more step."""
    trainer = GRPOTrainer(config, model_path, rank=info)
    set_model_state_dict(  # it adds the model's other entries to the dict it is given
        trainer.model,
        dict(adapter),
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    stats = trainer.accumulate_gradients(
        batch, compute_advantages(batch.rewards, batch.group_index)
    )
    grads = {
        n: full(p.grad).clone()
        for n, p in trainer.model.named_parameters()
        if p.grad is not None
    }
    base = {n: full(p).clone() for n, p in trainer.model.named_parameters()}
    loss = trainer.train_step(batch, 0)["train/loss"]
    # the gradients AdamW stepped with (clip_grad_norm_ scales them in place), under peft's saved names
    stepped = {
        n.replace(f".{lora_adapters.ADAPTER_NAME}", ""): full(p.grad).clone()
        for n, p in trainer.model.named_parameters()
        if p.grad is not None
    }
    changed = {
        n
        for n, p in trainer.model.named_parameters()
        if not torch.equal(full(p), base[n])
    }
    synced = trainer.state_dict_for_engine()
    trainer.save_checkpoint(save_dir, {"step": 0})
    return {
        "loss": stats.loss,
        "grads": grads,
        "changed": changed,
        "step_loss": loss,
        "stepped": stepped,
        "eps": trainer.optimizer.defaults["eps"],
        "synced": synced,
        "next_loss": trainer.train_step(batch, 1)["train/loss"],
    }


def resumed_loss(info, model_path, batch, config, save_dir):
    trainer = GRPOTrainer(config, model_path, rank=info)
    assert trainer.load_checkpoint(save_dir) == {"step": 0}
    return trainer.train_step(batch, 1)["train/loss"]


def test_lora_on_two_ranks_trains_syncs_and_checkpoints_the_adapter_alone(
    tiny_model_path, tokenizer, tmp_path
):
    batch = make_batch(tokenizer)
    adapter = random_adapter(tiny_model_path)
    single = train_and_save(
        None, tiny_model_path, batch, CONFIG, adapter, tmp_path / "single"
    )
    first, second = run_on_ranks(
        train_and_save,
        2,
        tiny_model_path,
        batch,
        SHARDED,
        adapter,
        tmp_path / "sharded",
    )
    # the single-process LoRA gradient, on the adapters alone
    assert first["loss"] == pytest.approx(single["loss"], abs=1e-5)
    assert set(first["grads"]) == set(single["grads"]) == set(adapter)
    worst = max(
        float((first["grads"][n] - g).abs().max()) for n, g in single["grads"].items()
    )
    assert worst < 1e-5, f"largest gradient difference {worst:.3g}"
    # a step moves the adapters and nothing else
    assert first["changed"] and first["changed"] <= set(adapter)
    assert first["step_loss"] == pytest.approx(single["step_loss"], abs=1e-5)
    # the engines get the adapter under peft's saved names, as from one process (main rank only)
    assert second["synced"] == {}
    assert set(first["synced"]) == set(single["synced"])
    # after one AdamW step the adapters agree as far as the optimizer's arithmetic lets gradients that agree
    # to reduction noise agree (adamw_first_step_bound): a fixed atol failed on an Intel CPU at an element
    # whose gradient is near AdamW's eps
    assert set(first["stepped"]) == set(single["stepped"]) == set(single["synced"])
    worst = max(
        float((first["stepped"][n] - g).abs().max())
        for n, g in single["stepped"].items()
    )
    assert worst < 1e-5, f"largest stepped-gradient difference {worst:.3g}"
    for name, tensor in single["synced"].items():
        bound = adamw_first_step_bound(
            CONFIG.lr, first["stepped"][name], single["stepped"][name], single["eps"]
        )
        excess = (first["synced"][name] - tensor).abs() - bound
        assert (excess <= 0).all(), (
            f"{name}: the ranks' adapter exceeds the AdamW first-step bound by {float(excess.max()):.3g}"
        )
    # the checkpoint: the adapter as peft saves it, and DCP shards of the adapters and their AdamW state
    saved = tmp_path / "sharded"
    assert (saved / lora_adapters.ADAPTER_CONFIG_FILE).is_file()
    on_disk = load_file(str(saved / lora_adapters.ADAPTER_WEIGHTS_FILE))
    assert set(on_disk) == set(single["synced"])
    assert not (saved / "model.safetensors.index.json").exists()
    keys = dcp.FileSystemReader(str(saved / DCP_DIR)).read_metadata()
    model_keys = [k for k in keys.state_dict_metadata if k.startswith("model.")]
    # no frozen base weight (torch keeps a tied alias, lm_head.weight, which it cannot tell is frozen)
    base_keys = [k for k in model_keys if ".lora_" not in k]
    assert len(model_keys) >= len(adapter) > 0
    assert set(base_keys) <= {"model.base_model.model.lm_head.weight"}
    # it resumes at one rank and in one process with the next step's loss
    expected = first["next_loss"]
    assert second["next_loss"] == pytest.approx(expected, abs=1e-6)
    one_rank = run_on_ranks(
        resumed_loss,
        1,
        tiny_model_path,
        batch,
        dataclasses.replace(SHARDED, num_ranks=1),
        saved,
    )
    assert one_rank[0] == pytest.approx(expected, abs=1e-5)
    assert resumed_loss(None, tiny_model_path, batch, CONFIG, saved) == pytest.approx(
        expected, abs=1e-5
    )


def bf16_scores(info, model_path, batch, config):
    """Frozen-base dtypes, bytes held and the scores of a bf16 LoRA trainer before any step."""
    trainer = GRPOTrainer(config, model_path, rank=info)
    return {
        "base_dtypes": {
            p.dtype for p in trainer.model.parameters() if not p.requires_grad
        },
        "memory": trainer.memory(),
        "logprobs": trainer.compute_logprobs(batch),
    }


def test_bf16_lora_ranks_hold_bf16_base_shards_and_score_as_one_process(
    tiny_model_path, tokenizer
):
    batch = make_batch(tokenizer)
    single, ranks = in_one_process_and_on_two_ranks(
        bf16_scores,
        tiny_model_path,
        batch,
        dataclasses.replace(CONFIG, param_dtype="bfloat16"),
    )
    for rank in ranks:
        assert rank["base_dtypes"] == {torch.bfloat16}
        for key in ("parameter_bytes", "optimizer_bytes"):
            assert rank["memory"][key] == pytest.approx(
                single["memory"][key] / 2, rel=0.10
            )
        assert torch.allclose(rank["logprobs"], single["logprobs"], atol=1e-4)
