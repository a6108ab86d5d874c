"""The built-in GRPO trainer on the tiny model: learning direction, micro-batching, TIS, NaN guard, engine weights."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from roll_async.config.schema import TrainerConfig
from roll_async.errors import NonFiniteLossError
from roll_async.trainer import GRPOTrainer, Trainer, build_trainer
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.collate import TrajectoryBatch, collate_trajectories
from roll_async.trainer.policy_model import warmup_lr
from roll_async.trajectory import Trajectory

RESPONSES = [
    ("<answer>Up</answer>", 1.0),
    ("<answer>Down</answer>", 0.0),
    ("<answer>Left, Up</answer>", 1.0),
    ("<answer>Right</answer>", -0.5),
    ("<answer>Left</answer>", 2.0),
    ("I push <answer>Up</answer>", 0.0),
]


def make_batch(tokenizer, behaviour_logprob: float = -6.9) -> TrajectoryBatch:
    """Three groups of two: hand-made trajectories with a two-turn conversation (prompt, reply, observation, reply)."""
    trajectories = []
    for i, (text, reward) in enumerate(RESPONSES):
        group = i // 2
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Push the box. Room {group}:\n#__P\n#X_#"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        reply = tokenizer(text, add_special_tokens=False)["input_ids"]
        obs = tokenizer(
            "<|im_end|>\n<|im_start|>user\n#_P_<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )["input_ids"]
        reply2 = tokenizer(
            "<answer>Down</answer>" if i % 2 else "<answer>Up</answer>",
            add_special_tokens=False,
        )["input_ids"]
        ids = prompt + reply + obs + reply2
        mask = [0] * len(prompt) + [1] * len(reply) + [0] * len(obs) + [1] * len(reply2)
        trajectories.append(
            Trajectory(
                tag="sokoban",
                group_id=group,
                episode_id=i,
                env_id=i,
                seed=group,
                traj_id=f"sokoban-g{group}-e{i}",
                created_step=0,
                token_ids=ids,
                response_mask=mask,
                logprobs=[behaviour_logprob if m else 0.0 for m in mask],
                episode_reward=reward,
            )
        )
    return collate_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)


def with_behaviour(batch: TrajectoryBatch, logprobs: torch.Tensor) -> TrajectoryBatch:
    tensors = batch.tensors()
    tensors["old_logprobs"] = logprobs * batch.response_mask
    return TrajectoryBatch(**tensors, traj_ids=batch.traj_ids)


def config(**overrides) -> TrainerConfig:
    base = dict(device="auto", lr=1e-3, micro_batch_size=4, max_grad_norm=1.0)
    base.update(overrides)
    return TrainerConfig(**base)


def grads(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().clone()
        for n, p in trainer.model.named_parameters()
        if p.grad is not None
    }


def params(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.fixture(scope="module")
def batch(tokenizer) -> TrajectoryBatch:
    return make_batch(tokenizer)


def test_build_trainer_default_is_grpo_on_cpu(tiny_model_path):
    trainer = build_trainer(config(), str(tiny_model_path))
    assert isinstance(trainer, GRPOTrainer) and isinstance(trainer, Trainer)
    assert trainer.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert trainer.ref_model is None  # no reference copy unless kl_coef > 0


def test_train_step_learns_in_the_advantage_direction(tiny_model_path, batch):
    # A small step: the clipped surrogate is a local model, a large Adam step can overshoot it.
    trainer = GRPOTrainer(config(lr=1e-4), tiny_model_path)
    # On-policy behaviour log-probs, so the importance weights are 1 and the test isolates the PPO update.
    batch = with_behaviour(batch, trainer.compute_logprobs(batch))
    advantages = compute_advantages(batch.rewards, batch.group_index)
    before_logp = trainer.compute_logprobs(batch)
    before_params = params(trainer)
    loss_before = trainer.accumulate_gradients(batch, advantages, before_logp).loss
    trainer.model.zero_grad(set_to_none=True)

    metrics = trainer.train_step(batch, step=0)

    for key in (
        "train/loss",
        "train/reward/mean",
        "train/reward/std",
        "train/importance_ratio/mean",
        "train/importance_ratio/max",
        "train/grad_norm",
        "train/clip_fraction",
        "train/entropy",
        "train/advantage/mean",
    ):
        assert key in metrics and isinstance(metrics[key], float), key
    assert metrics["train/loss"] == pytest.approx(loss_before, abs=1e-5)
    assert metrics["train/importance_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["train/reward/mean"] == pytest.approx(
        sum(r for _, r in RESPONSES) / len(RESPONSES)
    )
    assert any(not torch.equal(before_params[n], p) for n, p in params(trainer).items())

    loss_after = trainer.accumulate_gradients(batch, advantages, before_logp).loss
    trainer.model.zero_grad(set_to_none=True)
    assert loss_after < loss_before - 1e-2
    after_logp = trainer.compute_logprobs(batch)
    mask = batch.response_mask.bool()
    change = ((after_logp - before_logp) * mask).sum(1) / mask.sum(1)
    assert all(c > 0 for c, a in zip(change.tolist(), advantages.tolist()) if a > 0.5)
    assert all(c < 0 for c, a in zip(change.tolist(), advantages.tolist()) if a < -0.5)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_micro_batches_give_the_full_batch_gradient(tiny_model_path, batch, loss_agg):
    full = GRPOTrainer(
        config(micro_batch_size=len(batch), loss_agg=loss_agg), tiny_model_path
    )
    micro = GRPOTrainer(config(micro_batch_size=1, loss_agg=loss_agg), tiny_model_path)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    a = full.accumulate_gradients(batch, advantages)
    b = micro.accumulate_gradients(batch, advantages)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    ga, gb = grads(full), grads(micro)
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        assert torch.allclose(ga[name], gb[name], atol=1e-6, rtol=1e-4), name


def test_truncated_importance_weight_scales_the_gradient_up_to_the_cap(
    tiny_model_path, batch
):
    trainer = GRPOTrainer(config(tis_cap=2.0), tiny_model_path)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    logp = trainer.compute_logprobs(batch)

    on_policy = trainer.accumulate_gradients(with_behaviour(batch, logp), advantages)
    g_on = grads(trainer)
    trainer.model.zero_grad(set_to_none=True)
    # Behaviour 5 nats less likely than the trainer: raw ratio e^5 ≈ 148, truncated to 2.
    stale = trainer.accumulate_gradients(with_behaviour(batch, logp - 5.0), advantages)
    g_stale = grads(trainer)
    trainer.model.zero_grad(set_to_none=True)

    assert (
        on_policy.tis_truncated_fraction == 0.0 and stale.tis_truncated_fraction == 1.0
    )
    assert stale.importance_ratio_mean == pytest.approx(
        float(torch.tensor(5.0).exp()), rel=1e-3
    )
    for name in g_on:
        assert torch.allclose(g_stale[name], 2.0 * g_on[name], atol=1e-6, rtol=1e-4), (
            name
        )

    no_tis = GRPOTrainer(config(tis_cap=0.0), tiny_model_path)
    no_tis.accumulate_gradients(with_behaviour(batch, logp - 5.0), advantages)
    for name, g in grads(no_tis).items():
        assert torch.allclose(g, g_on[name], atol=1e-6, rtol=1e-4), name


def test_ppo_epochs_step_more_than_once_and_clip_later_epochs(tiny_model_path, batch):
    trainer = GRPOTrainer(
        config(ppo_epochs=3, lr=5e-3, clip_ratio_low=0.01, clip_ratio_high=0.01),
        tiny_model_path,
    )
    metrics = trainer.train_step(
        with_behaviour(batch, trainer.compute_logprobs(batch)), step=0
    )
    assert trainer.optimizer_steps == 3
    # epochs 2 and 3 move the ratio past the tight clip
    assert metrics["train/clip_fraction"] > 0


def test_non_finite_loss_raises_names_step_and_keeps_weights(
    tiny_model_path, tokenizer
):
    trainer = GRPOTrainer(config(), tiny_model_path)
    bad = make_batch(tokenizer)
    bad.rewards[2] = float("nan")
    before = params(trainer)
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train_step(bad, step=7)
    error = info.value
    assert error.step == 7 and "step 7" in str(error)
    assert "sokoban-g1-e2" in str(error) and error.traj_ids
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())
    assert not trainer.optimizer.state  # AdamW never stepped
    assert all(p.grad is None for p in trainer.model.parameters())
    trainer.train_step(make_batch(tokenizer), step=7)  # the trainer is still usable


def test_kl_reference_is_loaded_only_with_kl_coef(tiny_model_path, batch):
    trainer = GRPOTrainer(config(kl_coef=0.1), tiny_model_path)
    assert trainer.ref_model is not None
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    first = trainer.train_step(batch, step=0)
    assert first["train/kl"] == pytest.approx(
        0.0, abs=1e-6
    )  # the policy starts at the reference
    second = trainer.train_step(batch, step=1)
    assert second["train/kl"] > 0
    trainer.reset_reference()
    assert trainer.train_step(batch, step=2)["train/kl"] == pytest.approx(0.0, abs=1e-6)


def test_state_dict_for_engine_matches_the_saved_checkpoint_names(
    tiny_model_path, batch
):
    trainer = GRPOTrainer(config(), tiny_model_path)
    with safe_open(str(tiny_model_path / "model.safetensors"), "pt") as f:
        saved = {name: f.get_tensor(name) for name in f.keys()}
    weights = trainer.state_dict_for_engine()
    assert set(weights) == set(saved)
    # tied to model.embed_tokens.weight, as in the file
    assert "lm_head.weight" not in weights
    for name, tensor in weights.items():
        assert tensor.device.type == "cpu" and tensor.shape == saved[name].shape
        assert torch.equal(tensor, saved[name])
    trainer.train_step(batch, step=0)
    assert torch.equal(
        weights["model.norm.weight"], saved["model.norm.weight"]
    )  # a snapshot, not a view
    fresh = trainer.state_dict_for_engine()
    assert not torch.equal(
        fresh["model.embed_tokens.weight"], saved["model.embed_tokens.weight"]
    )
    # what the engine would receive must be serialisable as safetensors (no shared storage)
    from safetensors.torch import save

    assert save(fresh)


def test_bad_dtype_and_epochs_are_config_errors(tiny_model_path):
    from roll_async.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.dtype"):
        GRPOTrainer(config(dtype="float8"), tiny_model_path)
    with pytest.raises(ConfigError, match="ppo_epochs"):
        GRPOTrainer(config(ppo_epochs=0), tiny_model_path)


def test_batch_sampling_settings_shape_the_trained_distribution(tiny_model_path, batch):
    """With T=0.7 / top_p=0.9 on the batch, the loss scores the processed distribution, as compute_logprobs does."""
    import dataclasses

    from roll_async.sampling import SamplingSettings

    trainer = GRPOTrainer(config(), tiny_model_path)
    raw = trainer.compute_logprobs(batch)
    sampled = dataclasses.replace(batch, sampling=SamplingSettings(0.7, 0.9, -1))
    processed = trainer.compute_logprobs(sampled)
    mask = batch.response_mask.bool()
    mask[:, 0] = False
    assert (processed - raw)[mask].abs().mean() > 0.02
    behaviour = dataclasses.replace(
        sampled, old_logprobs=processed * batch.response_mask
    )
    assert trainer.train_step(behaviour, step=0)[
        "train/importance_ratio/mean"
    ] == pytest.approx(1.0, abs=1e-4)
    # the same behaviour logprobs scored without the transformation are visibly off-policy
    mismatched = dataclasses.replace(behaviour, sampling=SamplingSettings())
    fresh = GRPOTrainer(config(), tiny_model_path)
    assert (
        abs(fresh.train_step(mismatched, step=0)["train/importance_ratio/mean"] - 1.0)
        > 0.01
    )


def test_max_token_lag_masks_old_tokens_from_the_loss(tiny_model_path, batch):
    """Tokens sampled more than max_token_lag versions ago contribute nothing; the share is reported."""
    import dataclasses

    trainer = GRPOTrainer(config(max_token_lag=1), tiny_model_path)
    versions = torch.where(batch.response_mask.bool(), 2, -1)
    versions[0] = torch.where(
        batch.response_mask[0].bool(), 0, -1
    )  # row 0 lags the policy (version 2) by 2
    versioned = dataclasses.replace(batch, token_versions=versions, policy_version=2)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    masked = trainer.accumulate_gradients(versioned, advantages)
    g_masked = grads(trainer)
    trainer.model.zero_grad(set_to_none=True)
    without_row0 = batch.response_mask.clone()
    without_row0[0] = 0
    reference = trainer.accumulate_gradients(
        dataclasses.replace(batch, response_mask=without_row0), advantages
    )
    g_reference = grads(trainer)
    trainer.model.zero_grad(set_to_none=True)
    assert (
        masked.num_tokens
        == reference.num_tokens
        < int(batch.response_mask[:, 1:].sum())
    )
    for name in g_reference:
        assert torch.allclose(
            g_masked[name], g_reference[name], atol=1e-7, rtol=1e-5
        ), name

    metrics = trainer.train_step(versioned, step=0)
    row0 = int(batch.response_mask[0, 1:].sum())
    assert metrics["train/token_lag/masked_fraction"] == pytest.approx(
        row0 / int(batch.response_mask[:, 1:].sum())
    )
    assert metrics["train/token_lag/max"] == 2.0
    off = GRPOTrainer(config(), tiny_model_path).train_step(versioned, step=0)
    # default: off, lag still reported
    assert off["train/token_lag/masked_fraction"] == 0.0


def _lagged(batch: TrajectoryBatch, lagged_rows: list[int]) -> TrajectoryBatch:
    """``batch`` at policy version 2 with ``lagged_rows`` sampled at version 0, the others at version 2."""
    import dataclasses

    versions = torch.where(batch.response_mask.bool(), 2, -1)
    for row in lagged_rows:
        versions[row] = torch.where(batch.response_mask[row].bool(), 0, -1)
    return dataclasses.replace(batch, token_versions=versions, policy_version=2)


def test_a_micro_batch_with_no_scored_tokens_is_skipped_and_counted(
    tiny_model_path, batch
):
    """A micro-batch wholly masked by max_token_lag has no graph to backward: skipped, counted, not fatal."""
    trainer = GRPOTrainer(config(max_token_lag=1, micro_batch_size=2), tiny_model_path)
    before = params(trainer)
    metrics = trainer.train_step(_lagged(batch, [0, 1]), step=0)
    assert metrics["train/skipped_micro_batches"] == 1.0
    assert metrics["train/optimizer_steps"] == 1.0
    assert trainer.optimizer_steps == 1
    assert any(not torch.equal(before[n], p) for n, p in params(trainer).items())


def test_a_step_whose_micro_batches_are_all_skipped_makes_no_optimizer_step(
    tiny_model_path, batch
):
    trainer = GRPOTrainer(config(max_token_lag=1, micro_batch_size=2), tiny_model_path)
    before = params(trainer)
    metrics = trainer.train_step(_lagged(batch, list(range(len(batch)))), step=3)
    assert metrics["train/skipped_micro_batches"] == 3.0
    assert metrics["train/optimizer_steps"] == 0.0
    assert trainer.optimizer_steps == 0 and trainer.last_step == 3
    assert not trainer.optimizer.state
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_tokenizer_without_a_pad_token_collates_and_trains(
    tiny_model_path, tokenizer
):
    """Llama-3.1's published tokenizer has no pad token: padding is masked, so the EOS id pads."""
    import copy

    from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
    from roll_async.trainer import collate

    chatml = build_chatml_test_tokenizer()
    chatml.pad_token = None
    assert chatml.pad_token_id is None and chatml.eos_token_id is not None
    short, long = (
        Trajectory(
            tag="t",
            group_id=0,
            episode_id=i,
            env_id=i,
            seed=0,
            traj_id=f"t-{i}",
            created_step=0,
            token_ids=ids,
            response_mask=[0] * (len(ids) - 1) + [1],
            logprobs=[0.0] * (len(ids) - 1) + [-1.0],
            episode_reward=float(i),
        )
        for i, ids in enumerate(
            [
                chatml("<|im_start|>user\nUp<|im_end|>")["input_ids"],
                chatml("<|im_start|>user\nUp Down Left<|im_end|>")["input_ids"],
            ]
        )
    )
    # exactly what the pipeline passes: the tokenizer's pad_token_id, None here
    plain = collate_trajectories([short, long], pad_token_id=chatml.pad_token_id)
    assert plain.input_ids[0, len(short.token_ids) :].eq(0).all()  # documented: 0
    assert collate.padding_token_id(chatml) == chatml.eos_token_id
    padded = collate_trajectories(
        [short, long], pad_token_id=collate.padding_token_id(chatml)
    )
    pads = ~padded.attention_mask.bool()
    assert pads.any() and padded.input_ids[pads].eq(chatml.eos_token_id).all()

    padless = copy.deepcopy(tokenizer)
    padless.pad_token = None
    assert padless.pad_token_id is None
    batch = make_batch(padless)
    trainer = GRPOTrainer(config(), tiny_model_path, tokenizer=padless)
    metrics = trainer.train_step(batch, step=0)
    assert metrics["train/optimizer_steps"] == 1.0


def _changed_fraction(
    trainer: GRPOTrainer, batch: TrajectoryBatch, steps: int
) -> float:
    before = params(trainer)
    on_policy = with_behaviour(batch, trainer.compute_logprobs(batch))
    for step in range(steps):
        trainer.train_step(on_policy, step=step)
    after = params(trainer)
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    return changed / sum(t.numel() for t in before.values())


def test_bfloat16_compute_keeps_float32_weights_and_learns_at_a_small_lr(
    tiny_model_path, batch
):
    """param_dtype=bfloat16: autocast compute, float32 masters; pure-bf16 AdamW changed ~2% of weights at lr 1e-6."""
    fp32 = GRPOTrainer(config(lr=1e-6), tiny_model_path)
    bf16 = GRPOTrainer(config(lr=1e-6, param_dtype="bfloat16"), tiny_model_path)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    # the tolerance docs/architecture.md states: behaviour logprobs within 0.02 nats on average, 0.1 at most
    mask = batch.response_mask.bool().clone()
    mask[:, 0] = False
    gap = (bf16.compute_logprobs(batch) - fp32.compute_logprobs(batch))[mask].abs()
    assert float(gap.mean()) <= 0.02 and float(gap.max()) <= 0.1
    assert float(gap.max()) > 0  # it did compute in bfloat16
    reference = _changed_fraction(fp32, batch, steps=3)
    assert reference > 0.9
    assert _changed_fraction(bf16, batch, steps=3) >= 0.9 * reference


def test_pure_low_precision_weights_are_refused_naming_param_dtype(tiny_model_path):
    from pathlib import Path

    from roll_async.config.schema import load_config
    from roll_async.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"trainer.dtype='bfloat16'.*trainer.param_dtype=bfloat16"
    ):
        GRPOTrainer(config(dtype="bfloat16"), tiny_model_path)
    sokoban = Path(__file__).resolve().parents[3] / "configs" / "sokoban.yaml"
    with pytest.raises(ConfigError, match=r"trainer.param_dtype=bfloat16"):
        load_config(sokoban, ["trainer.dtype=bf16"])
    assert (
        load_config(sokoban, ["trainer.param_dtype=bfloat16"]).trainer.param_dtype
        == "bfloat16"
    )


def test_lr_warmup_ramps_the_first_steps_and_a_resumed_step_lands_on_its_value(
    tiny_model_path, batch
):
    assert [warmup_lr(1e-3, 4, s) for s in (0, 1, 3, 9)] == pytest.approx(
        [2.5e-4, 5e-4, 1e-3, 1e-3]
    )
    assert warmup_lr(1e-3, 0, 0) == 1e-3
    trainer = GRPOTrainer(config(lr=1e-3, lr_warmup_steps=4), tiny_model_path)
    before = params(trainer)
    first = trainer.train_step(batch, step=0)
    moved = max(
        float((after - before[name]).abs().max())
        for name, after in params(trainer).items()
    )
    assert first["train/lr"] == pytest.approx(2.5e-4)
    # AdamW's first step moves a weight by about its lr: a quarter of 1e-3 here
    assert 1e-4 < moved < 4e-4
    assert trainer.train_step(batch, step=1)["train/lr"] == pytest.approx(5e-4)
    assert trainer.train_step(batch, step=9)["train/lr"] == pytest.approx(1e-3)


def test_a_batch_without_learning_signal_leaves_the_weights_where_they_are(
    tiny_model_path, batch, tokenizer
):
    """Every group's rewards equal (all advantages 0): no gradient, so no optimizer step. AdamW would
    otherwise go on moving every weight by its momentum from earlier steps, step after step: a
    self-play run whose moves all became invalid drifted to a uniform distribution over the vocabulary.
    """
    trainer = GRPOTrainer(config(lr=1e-3), tiny_model_path)
    trainer.train_step(batch, step=0)
    flat = make_batch(tokenizer)
    flat.rewards = torch.zeros_like(flat.rewards)
    before = params(trainer)
    metrics = trainer.train_step(flat, step=1)
    assert metrics["train/optimizer_steps"] == 0.0
    assert trainer.optimizer_steps == 1
    assert all(torch.equal(before[n], p) for n, p in params(trainer).items())
