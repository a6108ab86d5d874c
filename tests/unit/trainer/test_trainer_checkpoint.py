"""Checkpoints: exact resume, atomic layout, finding and pruning checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from roll_async.config.schema import TrainerConfig
from roll_async.trainer import GRPOTrainer
from roll_async.trainer.checkpoint import (
    checkpoint_dir,
    is_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    resolve_resume_dir,
)
from roll_async.trainer.collate import collate_trajectories
from roll_async.trajectory import Trajectory


def make_batch(tokenizer, seed: int):
    gen = torch.Generator().manual_seed(seed)
    trajectories = []
    for i in range(4):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Room {i // 2}: #_P_#"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        reply = tokenizer(
            ["<answer>Up</answer>", "<answer>Left</answer>"][i % 2],
            add_special_tokens=False,
        )["input_ids"]
        ids = prompt + reply
        mask = [0] * len(prompt) + [1] * len(reply)
        trajectories.append(
            Trajectory(
                tag="t",
                group_id=i // 2,
                episode_id=i,
                env_id=i,
                seed=0,
                traj_id=f"t-{seed}-{i}",
                created_step=0,
                token_ids=ids,
                response_mask=mask,
                logprobs=[-7.0 * m for m in mask],
                episode_reward=float(torch.rand(1, generator=gen)),
            )
        )
    return collate_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)


def cfg() -> TrainerConfig:
    return TrainerConfig(lr=1e-3, micro_batch_size=2)


def test_resume_continues_exactly(tiny_model_path, tokenizer, tmp_path):
    b1, b2 = make_batch(tokenizer, 1), make_batch(tokenizer, 2)
    original = GRPOTrainer(cfg(), tiny_model_path)
    original.train_step(b1, step=0)
    extra = {"step": 1, "scheduler": {"seed_offset": 17, "rng": [1, 2, 3]}}
    original.save_checkpoint(tmp_path / "checkpoints" / "step_1", extra)
    continued = original.train_step(b2, step=1)

    resumed = GRPOTrainer(cfg(), tiny_model_path)
    # a run dir resolves to its newest checkpoint
    assert resumed.load_checkpoint(tmp_path) == extra
    assert resumed.optimizer_steps == 1 and resumed.last_step == 0
    again = resumed.train_step(b2, step=1)

    assert again == continued
    for (name, a), (_, b) in zip(
        original.model.named_parameters(), resumed.model.named_parameters()
    ):
        assert torch.equal(a, b), name
    # tied embeddings stay tied after loading
    assert (
        resumed.model.lm_head.weight.data_ptr()
        == resumed.model.model.embed_tokens.weight.data_ptr()
    )


def test_checkpoint_layout_is_complete_loadable_and_atomic(
    tiny_model_path, tokenizer, tmp_path
):
    from transformers import AutoModelForCausalLM

    trainer = GRPOTrainer(cfg(), tiny_model_path)
    target = tmp_path / "checkpoints" / "step_3"
    trainer.save_checkpoint(target, {"step": 3})
    names = {p.name for p in target.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "extra_state.pt",
        "trainer_state.json",
    } <= names
    assert "tokenizer.json" in names or "tokenizer_config.json" in names
    state = json.loads((target / "trainer_state.json").read_text())
    assert state["format"] == 1 and state["trainer_config"]["lr"] == 1e-3
    # the checkpoint is itself an HF model directory
    AutoModelForCausalLM.from_pretrained(target)
    # saving again over it replaces it, and no temp directories are left behind
    trainer.train_step(make_batch(tokenizer, 0), step=3)
    trainer.save_checkpoint(target, {"step": 4})
    assert trainer.load_checkpoint(target) == {"step": 4}
    assert [p.name for p in target.parent.iterdir()] == ["step_3"]


def test_find_and_prune_checkpoints(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 10, 5):
        path = checkpoint_dir(root, step)
        path.mkdir(parents=True)
        (path / "trainer_state.json").write_text("{}")
    (root / "step_11").mkdir()  # incomplete: no trainer_state.json
    (root / ".step_12.tmp-abc").mkdir()
    assert [s for s, _ in list_checkpoints(root)] == [2, 5, 10]
    assert resolve_resume_dir(tmp_path / "run").name == "step_10"
    assert resolve_resume_dir(root).name == "step_10"
    assert resolve_resume_dir(root / "step_5").name == "step_5"
    assert is_checkpoint(root / "step_2") and not is_checkpoint(root / "step_11")
    removed = prune_checkpoints(root, keep_last=2)
    assert [p.name for p in removed] == ["step_2"]
    assert [s for s, _ in list_checkpoints(root)] == [5, 10]
    with pytest.raises(FileNotFoundError, match="no checkpoint found"):
        resolve_resume_dir(tmp_path / "empty")


def test_load_from_a_non_checkpoint_is_a_clear_error(tiny_model_path, tmp_path):
    trainer = GRPOTrainer(cfg(), tiny_model_path)
    with pytest.raises(FileNotFoundError, match="resume_from"):
        trainer.load_checkpoint(tmp_path)


def test_resume_after_sft_restores_the_post_sft_kl_reference(
    tiny_model_path, tokenizer, tmp_path
):
    """sft_warmup + kl_coef: the reference is the post-SFT snapshot; resume must not reload model.path's."""
    from roll_async.trainer.sft import build_sft_examples, run_sft

    cfg = TrainerConfig(device="cpu", lr=1e-3, micro_batch_size=4, kl_coef=0.1)
    trainer = GRPOTrainer(cfg, tiny_model_path)
    examples = build_sft_examples(
        "sokoban",
        {},
        [0, 1],
        tokenizer,
        "Reply inside <answer></answer>.",
        demo_fraction=1.0,
    )
    run_sft(trainer, examples, steps=3, lr=1e-2, batch_size=2)
    trainer.train_step(make_batch(tokenizer, 0), step=0)
    reference = {n: t.clone() for n, t in trainer.ref_model.state_dict().items()}
    initial = GRPOTrainer(cfg, tiny_model_path).ref_model.state_dict()
    assert any(
        not torch.equal(reference[n], initial[n]) for n in reference
    )  # SFT moved it
    trainer.save_checkpoint(tmp_path / "step_0", {"step": 0})

    resumed = GRPOTrainer(cfg, tiny_model_path)
    resumed.load_checkpoint(tmp_path / "step_0")
    for name, tensor in resumed.ref_model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name
    batch = make_batch(tokenizer, 1)
    assert resumed.train_step(batch, step=1)["train/kl"] == pytest.approx(
        trainer.train_step(batch, step=1)["train/kl"], rel=1e-5, abs=1e-7
    )


def test_resume_restores_the_torch_rng_and_export_leaves_it_out(
    tiny_model_path, tmp_path
):
    from roll_async.model.export import export_checkpoint

    trainer = GRPOTrainer(TrainerConfig(device="cpu"), tiny_model_path)
    torch.manual_seed(1234)
    run = tmp_path / "run"
    trainer.save_checkpoint(run / "checkpoints" / "step_0", {"step": 0})
    expected = torch.rand(4)
    torch.manual_seed(999)  # the run goes on drawing; a resume must rewind
    GRPOTrainer(TrainerConfig(device="cpu"), tiny_model_path).load_checkpoint(run)
    assert torch.equal(torch.rand(4), expected)
    out = export_checkpoint(run, tmp_path / "hf")
    assert not list(out.glob("rng_rank*"))
