"""LoRA on the built-in trainer (trainer.lora): only adapters train, checkpoint and sync; the reference is the base."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from roll_async.cli import main
from roll_async.config.schema import (
    LoraConfig,
    PipelineConfig,
    TrainerConfig,
    load_config,
)
from roll_async.engine.lora_adapters import (
    AdapterVersions,
    LoraServing,
    serving_max_loras,
)
from roll_async.errors import ConfigError
from roll_async.trainer import GRPOTrainer
from roll_async.trainer import lora as lora_adapters
from roll_async.trainer.checkpoint import checkpoint_state_dict
from roll_async.trainer.losses import token_logprobs
from tests.unit.trainer.test_trainer_grpo import make_batch


def lora_trainer(path, **overrides) -> GRPOTrainer:
    lora = overrides.pop("lora", LoraConfig(rank=8))
    base = dict(device="cpu", lr=1e-2, micro_batch_size=4, lora=lora)
    base.update(overrides)
    return GRPOTrainer(TrainerConfig(**base), path)


def randomise_adapters(trainer: GRPOTrainer, seed: int = 0) -> None:
    """B = 0 at start makes the adapter a no-op; random B makes it matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def split_params(trainer: GRPOTrainer) -> tuple[dict, dict]:
    base, adapters = {}, {}
    for name, param in trainer.model.named_parameters():
        (adapters if ".lora_" in name else base)[name] = param.detach().clone()
    return base, adapters


def scored_logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            score_mask=batch.response_mask.bool(),
        ).logprobs


def test_a_train_step_changes_only_adapter_weights(tiny_model_path, tokenizer):
    trainer = lora_trainer(tiny_model_path)
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    trainable = {n for n, p in trainer.model.named_parameters() if id(p) in optimized}
    assert trainable and all(".lora_" in n for n in trainable)
    base_before, adapters_before = split_params(trainer)
    batch = make_batch(tokenizer)
    for step in range(
        2
    ):  # B = 0 at start: A only gets a gradient from the second step on
        trainer.train_step(batch, step=step)
    base_after, adapters_after = split_params(trainer)
    for name, tensor in base_before.items():
        assert torch.equal(tensor, base_after[name]), name
    for name, tensor in adapters_before.items():
        assert not torch.equal(tensor, adapters_after[name]), name


def test_bf16_lora_holds_the_frozen_base_in_bf16_and_scores_within_tolerance(
    tiny_model_path, tokenizer
):
    # a frozen weight needs no float32 master copy: with trainer.param_dtype=bfloat16 the base takes
    # half the bytes, the adapters (and AdamW) stay float32, and scores stay within the stated bf16
    # tolerance of float32 (docs/architecture.md: 0.02 nats mean, 0.1 max)
    batch = make_batch(tokenizer)
    fp32 = lora_trainer(tiny_model_path)
    bf16 = lora_trainer(tiny_model_path, param_dtype="bfloat16")
    for trainer, base_dtype in ((fp32, torch.float32), (bf16, torch.bfloat16)):
        for name, param in trainer.model.named_parameters():
            expected = torch.float32 if param.requires_grad else base_dtype
            assert param.dtype == expected, name
    assert bf16.memory()["parameter_bytes"] < 0.6 * fp32.memory()["parameter_bytes"]
    assert bf16.memory()["optimizer_bytes"] == fp32.memory()["optimizer_bytes"]
    mask = batch.response_mask.bool().clone()
    mask[:, 0] = False
    gap = (bf16.compute_logprobs(batch) - fp32.compute_logprobs(batch))[mask].abs()
    assert 0 < float(gap.max()) < 0.1 and float(gap.mean()) < 0.02
    _, before = split_params(bf16)
    assert math.isfinite(bf16.train_step(batch, 0)["train/loss"])
    _, after = split_params(bf16)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_reference_is_the_base_model_with_adapters_off(tiny_model_path, tokenizer):
    trainer = lora_trainer(tiny_model_path, kl_coef=0.1)
    assert trainer.ref_model is trainer.model  # no second copy of the weights
    randomise_adapters(trainer)
    batch = make_batch(tokenizer)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    expected = scored_logprobs(base, batch)
    with lora_adapters.adapters_off(trainer.model):
        reference = scored_logprobs(trainer.model, batch)
    adapted = scored_logprobs(trainer.model, batch)
    torch.testing.assert_close(reference, expected, atol=1e-6, rtol=0)
    assert (
        adapted - expected
    ).abs().max() > 1e-3  # the adapters are on again outside the context
    metrics = trainer.train_step(batch, step=0)
    assert metrics["train/kl"] > 0


def test_merged_state_dict_equals_peft_merge_and_unload(tiny_model_path):
    trainer = lora_trainer(tiny_model_path, lora=LoraConfig(rank=8, alpha=32))
    randomise_adapters(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    merged = lora_adapters.merged_state_dict(trainer.model)
    for name, param in trainer.model.named_parameters():  # nothing mutated
        assert torch.equal(param, before[name]), name

    reference = GRPOTrainer(
        TrainerConfig(device="cpu", lora=LoraConfig(rank=8, alpha=32)), tiny_model_path
    )
    reference.model.load_state_dict(trainer.model.state_dict())
    expected = checkpoint_state_dict(reference.model.merge_and_unload())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert set(merged) == set(expected) == set(checkpoint_state_dict(base))
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=0)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        base.state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )


def test_state_dict_for_engine_follows_lora_sync(tiny_model_path):
    trainer = lora_trainer(tiny_model_path)
    adapter = trainer.state_dict_for_engine()
    assert adapter and all(".lora_" in name for name in adapter)
    assert all(t.device.type == "cpu" for t in adapter.values())
    trainer.config.lora.sync = "merged"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert set(trainer.state_dict_for_engine()) == set(checkpoint_state_dict(base))


def test_checkpoint_round_trip_restores_adapter_and_optimizer(
    tiny_model_path, tokenizer, tmp_path
):
    trainer = lora_trainer(tiny_model_path)
    batch = make_batch(tokenizer)
    for step in range(2):
        trainer.train_step(batch, step=step)
    trainer.save_checkpoint(tmp_path / "ckpt", {"step": 1})
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= files
    assert "model.safetensors" not in files  # only the adapter is saved
    state = json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())
    assert state["model_path"] == str(tiny_model_path)
    assert state["trainer_config"]["lora"]["rank"] == 8

    restored = lora_trainer(tiny_model_path)
    assert restored.load_checkpoint(tmp_path / "ckpt") == {"step": 1}
    saved = lora_adapters.adapter_state_dict(trainer.model)
    loaded = lora_adapters.adapter_state_dict(restored.model)
    assert saved.keys() == loaded.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, loaded[name]), name
    a, b = trainer.optimizer.state_dict(), restored.optimizer.state_dict()
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for index, entry in a["state"].items():
        for key, value in entry.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(b["state"][index][key])
            )
    assert restored.optimizer_steps == trainer.optimizer_steps

    full = GRPOTrainer(TrainerConfig(device="cpu"), tiny_model_path)
    full.save_checkpoint(tmp_path / "full", {"step": 0})
    with pytest.raises(RuntimeError, match="adapter_model.safetensors"):
        lora_trainer(tiny_model_path).load_checkpoint(tmp_path / "full")


def test_export_of_a_lora_run_writes_the_merged_model(
    tiny_model_path, tokenizer, tmp_path
):
    run = tmp_path / "run"
    trainer = lora_trainer(tiny_model_path)
    randomise_adapters(trainer)
    trainer.save_checkpoint(run / "checkpoints" / "step_0", {"step": 0})
    (run / "config.yaml").write_text(f"model:\n  path: {tiny_model_path}\n")
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert "config.json" in names and not names & {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    model = AutoModelForCausalLM.from_pretrained(out)
    merged = lora_adapters.merged_state_dict(trainer.model)
    exported = checkpoint_state_dict(model)
    assert set(exported) == set(merged)
    for name, tensor in merged.items():
        torch.testing.assert_close(exported[name], tensor, atol=1e-6, rtol=0)


def test_target_modules_the_model_lacks_are_a_config_error(tiny_model_path):
    with pytest.raises(ConfigError) as info:
        lora_trainer(tiny_model_path, lora=LoraConfig(rank=8, target_modules=["qkv"]))
    message = str(info.value)
    assert "\n" not in message
    assert "trainer.lora.target_modules" in message and "qkv" in message
    assert "q_proj" in message  # the fix: the modules there are
    names = lora_adapters.model_linear_module_names(tiny_model_path)
    assert {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    } <= names


def test_preflight_checks_target_modules_before_any_actor(tiny_model_path):
    from roll_async.pipelines.preflight import check_lora_targets

    config = PipelineConfig()
    config.trainer.lora = LoraConfig(rank=8, target_modules=["q_proj", "c_attn"])
    with pytest.raises(ConfigError, match=r"trainer.lora.target_modules: .*c_attn"):
        check_lora_targets(config, str(tiny_model_path))
    config.trainer.lora = LoraConfig(rank=8, target_modules=["q_proj", "up_proj"])
    check_lora_targets(config, str(tiny_model_path))


SOKOBAN = str(Path(__file__).resolve().parents[3] / "configs" / "sokoban.yaml")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["trainer.lora.rank=-1"], "trainer.lora.rank=-1"),
        (["trainer.lora.rank=8", "trainer.lora.alpha=0"], "trainer.lora.alpha=0"),
        (["trainer.lora.rank=8", "trainer.lora.dropout=1.5"], r"within \[0, 1\)"),
        (["trainer.lora.rank=8", "trainer.lora.dropout=0.1"], "switches dropout off"),
        (["trainer.lora.rank=8", "trainer.lora.target_modules=[]"], "is empty"),
        (["trainer.lora.rank=1024"], "trainer.lora.sync=merged"),
        (["trainer.lora.rank=8", "trainer.lora.sync=delta"], "trainer.lora.sync"),
    ],
)
def test_lora_config_rules(overrides, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(SOKOBAN, overrides)
    assert "\n" not in str(info.value)


def test_lora_is_off_by_default_and_loads_when_on():
    assert load_config(SOKOBAN).trainer.lora.rank == 0
    config = load_config(
        SOKOBAN,
        [
            "trainer.lora.rank=16",
            "trainer.lora.sync=merged",
            "trainer.lora.target_modules=[q_proj,v_proj]",
        ],
    )
    assert config.trainer.lora == LoraConfig(
        rank=16, target_modules=["q_proj", "v_proj"], sync="merged"
    )


def test_engines_keep_max_staleness_plus_one_versions():
    assert serving_max_loras(3) == 4
    assert serving_max_loras(1) == 2
    assert serving_max_loras(0) == 2  # sync mode's bound
    assert LoraServing(rank=8, max_loras=4).engine_kwargs() == {
        "enable_lora": True,
        "max_loras": 4,
        "max_cpu_loras": 4,
        "max_lora_rank": 8,
    }
    assert LoraServing(rank=12, max_loras=2).engine_kwargs()["max_lora_rank"] == 16


def test_adapter_versions_keep_the_newest_and_those_in_flight():
    versions = AdapterVersions(
        LoraServing(rank=8, max_loras=2, adapter_config={"r": 8})
    )
    try:
        assert versions.acquire() == (None, None)  # before the first sync: the base
        one = versions.write(1, {"w": torch.zeros(2)})
        assert (
            one.lora_int_id == 2
            and (versions.root / "v1" / "adapter_config.json").is_file()
        )
        request, version = versions.acquire()
        assert (request, version) == (one, 1)
        versions.write(2, {"w": torch.ones(2)})
        versions.write(3, {"w": torch.ones(2)})
        assert (
            versions.removable() == []
        )  # v1 is older than the newest two, but a request runs on it
        versions.release(1)
        assert [r.lora_int_id for r in versions.removable()] == [2]
        assert versions.loaded_versions() == [2, 3]
        assert not (versions.root / "v1").exists()
        assert versions.acquire()[1] == 3
    finally:
        versions.close()
    assert not versions.root.exists()


def test_a_snapshot_request_runs_on_the_adapter_k_versions_back():
    """``adapter_lag`` k (a ``snapshot:<k>`` game seat): k loaded versions back, the oldest while fewer exist."""
    versions = AdapterVersions(
        LoraServing(rank=8, max_loras=3, adapter_config={"r": 8})
    )
    try:
        assert versions.acquire(2) == (None, None)
        versions.write(0, {"w": torch.zeros(2)})
        assert versions.acquire(2)[1] == 0  # one version: the snapshot plays it
        for version in (1, 2, 3):
            versions.write(version, {"w": torch.ones(2)})
        assert [versions.acquire(lag)[1] for lag in (0, 1, 2, 5)] == [3, 2, 1, 0]
        # v0 is kept while a snapshot request runs on it, then goes (max_loras 3: v1-v3)
        for version in (3, 2, 1):
            versions.release(version)
        assert versions.removable() == []
        versions.release(0)
        versions.release(0)
        assert [r.lora_int_id for r in versions.removable()] == [1]
    finally:
        versions.close()
