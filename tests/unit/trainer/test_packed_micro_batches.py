"""Micro-batches by token budget, packed without padding: the plan, the packed forward, and GRPOTrainer on them.

The packed path must be an exact stand-in for the padded one: same log-probs, same loss, same gradient of
every parameter, on the tiny Qwen2 model and the Llama 3 and Gemma 3 zoo models (Gemma 3 with a
sliding-window layer shorter than the longest row).
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from roll_async.config.schema import TrainerConfig, load_config
from roll_async.errors import ConfigError
from roll_async.trainer import GRPOTrainer
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.collate import TrajectoryBatch, collate_trajectories
from roll_async.trainer.losses import token_logprobs
from roll_async.trainer.micro_batches import (
    MicroBatch,
    model_supports_packing,
    packed_token_logprobs,
    plan_micro_batches,
)
from roll_async.trajectory import Trajectory
from tests.unit.trainer.test_trainer_grpo import grads

FAMILIES = ["qwen2", "llama3", "gemma3"]
#: Skewed: most rows short, a few long (one past Gemma 3's 128-token sliding window), one empty.
LENGTHS = [9, 150, 4, 12, 0, 7, 96, 1, 20, 5, 60, 3]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model_paths(tiny_model_path) -> dict[str, str]:
    from roll_async.model.families import build_family_model

    return {
        "qwen2": str(tiny_model_path),
        "llama3": str(build_family_model("llama3")),
        "gemma3": str(build_family_model("gemma3")),
    }


def skewed_batch(
    lengths: list[int] = LENGTHS, vocab: int = 1000, seed: int = 0
) -> TrajectoryBatch:
    """Groups of two trajectories of the given lengths: a prompt, then a response with off-policy logprobs."""
    rng = random.Random(seed)
    trajectories = []
    for i, n in enumerate(lengths):
        prompt = min(n, max(1, n // 3))
        mask = [0] * prompt + [1] * (n - prompt)
        trajectories.append(
            Trajectory(
                tag="t",
                group_id=i // 2,
                episode_id=i,
                env_id=i,
                seed=0,
                traj_id=f"t-{i}",
                created_step=0,
                token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                response_mask=mask,
                logprobs=[-rng.uniform(0.5, 8.0) if m else 0.0 for m in mask],
                episode_reward=float(rng.choice([0.0, 1.0, 2.0])) + 0.1 * i,
            )
        )
    return collate_trajectories(trajectories, pad_token_id=0)


def trainer_config(**overrides) -> TrainerConfig:
    base = dict(device="cpu", lr=1e-3, micro_batch_size=4, max_grad_norm=1.0)
    base.update(overrides)
    return TrainerConfig(**base)


def assert_same_grads(a: GRPOTrainer, b: GRPOTrainer) -> None:
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        assert torch.allclose(ga[name], gb[name], atol=TOLERANCE, rtol=0), (
            name,
            float((ga[name] - gb[name]).abs().max()),
        )


# -- the plan ----------------------------------------------------------------------------------------


def test_no_budget_gives_consecutive_chunks_of_micro_batch_size():
    lengths = [5, 0, 7, 3, 9, 2, 4]
    plan = plan_micro_batches(lengths, micro_batch_size=3)
    assert plan == [
        MicroBatch(rows=(0, 1, 2), tokens=12),
        MicroBatch(rows=(3, 4, 5), tokens=14),
        MicroBatch(rows=(6,), tokens=4),
    ]
    assert plan_micro_batches([], micro_batch_size=3) == []


@pytest.mark.parametrize("seed", range(20))
def test_a_budget_plan_holds_every_row_once_within_the_budget(seed):
    rng = random.Random(seed)
    lengths = [
        rng.choice([0, rng.randint(1, 20), rng.randint(1, 200)])
        for _ in range(rng.randint(1, 40))
    ]
    budget = max(lengths) + rng.randint(0, 300)
    plan = plan_micro_batches(lengths, micro_batch_size=2, max_tokens=budget)
    rows = [r for mb in plan for r in mb.rows]
    assert sorted(rows) == list(range(len(lengths)))
    for mb in plan:
        assert list(mb.rows) == sorted(mb.rows)
        assert mb.tokens == sum(lengths[r] for r in mb.rows) <= budget
    assert [mb.rows[0] for mb in plan] == sorted(mb.rows[0] for mb in plan)
    # deterministic: the same lengths (even as another sequence type) give the same plan
    assert plan == plan_micro_batches(
        tuple(lengths), micro_batch_size=7, max_tokens=budget
    )
    # first-fit decreasing never leaves two micro-batches that would fit into one
    for i, a in enumerate(plan):
        for b in plan[i + 1 :]:
            assert a.tokens + b.tokens > budget or 0 in (a.tokens, b.tokens)


def test_a_budget_plan_packs_short_rows_around_long_ones():
    # longest first: 90 and 80 open two micro-batches, 20 then 10 fill them, the last 10 opens a third
    plan = plan_micro_batches([10, 90, 10, 80, 20], micro_batch_size=1, max_tokens=100)
    assert plan == [
        MicroBatch(rows=(0, 1), tokens=100),
        MicroBatch(rows=(2,), tokens=10),
        MicroBatch(rows=(3, 4), tokens=100),
    ]


def test_empty_rows_belong_to_a_micro_batch():
    plan = plan_micro_batches([0, 0, 0], micro_batch_size=1, max_tokens=8)
    assert plan == [MicroBatch(rows=(0, 1, 2), tokens=0)]


def test_a_row_longer_than_the_budget_names_the_key_the_length_and_the_fix():
    with pytest.raises(ConfigError) as info:
        plan_micro_batches([5, 130, 7], micro_batch_size=4, max_tokens=100)
    message = str(info.value)
    assert "trainer.max_tokens_per_micro_batch=100" in message
    assert "130 tokens" in message and "row 1" in message
    assert "sequence_length" in message and "set it to 0" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="must be >= 0"):
        plan_micro_batches([5], micro_batch_size=4, max_tokens=-1)


# -- the packed forward ------------------------------------------------------------------------------


def test_model_supports_packing_only_text_models_with_a_packing_attention(
    tiny_model_path,
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert model_supports_packing(model)

    def fake(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    assert model_supports_packing(fake(_attn_implementation="eager"))
    assert model_supports_packing(fake(_attn_implementation="flash_attention_2"))
    assert not model_supports_packing(fake(_attn_implementation="some_kernel"))
    assert not model_supports_packing(
        fake(_attn_implementation="sdpa", vision_config=SimpleNamespace())
    )
    assert not model_supports_packing(object())


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logprobs_equal_padded_logprobs(model_paths, family):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_paths[family])
    assert model_supports_packing(model)
    batch = skewed_batch(vocab=model.config.vocab_size)
    scored = batch.response_mask.bool().clone()
    scored[:, 0] = False
    for rows in ([1, 0, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [4], [1]):
        index = torch.tensor(rows)
        width = max(int(batch.attention_mask[index].sum(dim=1).max()), 1)
        with torch.no_grad():
            padded = token_logprobs(
                model,
                batch.input_ids[index, :width],
                batch.attention_mask[index, :width],
                batch.position_ids[index, :width],
                score_mask=scored[index, :width],
                with_entropy=True,
            )
            packed = packed_token_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.position_ids,
                rows,
                score_mask=scored,
                with_entropy=True,
            )
        assert packed.logprobs.shape == padded.logprobs.shape == (len(rows), width)
        assert torch.allclose(packed.logprobs, padded.logprobs, atol=TOLERANCE, rtol=0)
        assert torch.allclose(packed.entropy, padded.entropy, atol=TOLERANCE, rtol=0)


def test_the_first_token_of_each_packed_row_is_never_scored(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = skewed_batch([6, 5, 7])
    everything = batch.attention_mask.bool()  # position 0 included on purpose
    with torch.no_grad():
        out = packed_token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids,
            [0, 1, 2],
            score_mask=everything,
        )
    assert torch.all(out.logprobs[:, 0] == 0)
    assert torch.all(out.logprobs[:, 1:5] < 0)


def test_packing_refuses_position_ids_that_do_not_restart_at_zero(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = skewed_batch([6, 5])
    with pytest.raises(ValueError, match="0..L-1"):
        packed_token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.position_ids + 1,
            [0, 1],
            score_mask=batch.response_mask.bool(),
        )


# -- GRPOTrainer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_packed_training_gives_the_padded_loss_and_gradients(
    model_paths, family, loss_agg
):
    padded = GRPOTrainer(trainer_config(loss_agg=loss_agg), model_paths[family])
    packed = GRPOTrainer(
        trainer_config(loss_agg=loss_agg, max_tokens_per_micro_batch=170),
        model_paths[family],
    )
    assert not padded.packing and packed.packing
    batch = skewed_batch(vocab=padded.model.config.vocab_size)
    assert packed.plan(batch) != padded.plan(batch)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    proximal = padded.compute_logprobs(batch)
    assert torch.allclose(
        packed.compute_logprobs(batch), proximal, atol=TOLERANCE, rtol=0
    )
    a = padded.accumulate_gradients(batch, advantages, proximal - 0.05)
    b = packed.accumulate_gradients(batch, advantages, proximal - 0.05)
    assert a.loss == pytest.approx(b.loss, abs=TOLERANCE)
    assert a.num_tokens == b.num_tokens
    assert a.entropy == pytest.approx(b.entropy, abs=TOLERANCE)
    assert a.clip_fraction == pytest.approx(b.clip_fraction)
    assert torch.allclose(a.logprobs, b.logprobs, atol=TOLERANCE, rtol=0)
    assert_same_grads(padded, packed)


def test_train_step_packed_matches_padded_with_a_kl_reference(tiny_model_path):
    padded = GRPOTrainer(trainer_config(kl_coef=0.1, ppo_epochs=2), tiny_model_path)
    packed = GRPOTrainer(
        trainer_config(kl_coef=0.1, ppo_epochs=2, max_tokens_per_micro_batch=200),
        tiny_model_path,
    )
    batch = skewed_batch()
    advantages = compute_advantages(batch.rewards, batch.group_index)
    a = padded.accumulate_gradients(batch, advantages)
    b = packed.accumulate_gradients(batch, advantages)
    assert a.kl == pytest.approx(b.kl, abs=TOLERANCE)
    assert_same_grads(padded, packed)
    # Weights after AdamW are not compared: its first step moves each weight by lr * g / (|g| + eps), so
    # rounding-level differences in gradients near 0 move weights by up to ~lr. The step's metrics are.
    first = padded.train_step(batch, step=0)
    second = packed.train_step(batch, step=0)
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy"):
        assert first[key] == pytest.approx(second[key], abs=TOLERANCE), key
    assert first["train/grad_norm"] == pytest.approx(
        second["train/grad_norm"], rel=1e-4
    )


def test_a_budget_micro_batch_with_no_scored_token_is_skipped_and_counted(
    tiny_model_path,
):
    trainer = GRPOTrainer(
        trainer_config(max_token_lag=1, max_tokens_per_micro_batch=170),
        tiny_model_path,
    )
    batch = skewed_batch()
    plan = trainer.plan(batch)
    assert len(plan) >= 2
    # every response token of the first micro-batch's rows sampled 3 versions before the policy
    versions = torch.where(batch.response_mask.bool(), 2, -1)
    for row in plan[0].rows:
        versions[row] = torch.where(batch.response_mask[row].bool(), 0, -1)
    lagged = dataclasses.replace(batch, token_versions=versions, policy_version=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer.train_step(lagged, step=0)
    assert metrics["train/skipped_micro_batches"] == 1.0
    assert metrics["train/optimizer_steps"] == 1.0
    assert any(
        not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters())
    )


@pytest.mark.parametrize("budget", [0, 170])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_path, budget):
    plain = GRPOTrainer(
        trainer_config(max_tokens_per_micro_batch=budget), tiny_model_path
    )
    checkpointed = GRPOTrainer(
        trainer_config(max_tokens_per_micro_batch=budget, gradient_checkpointing=True),
        tiny_model_path,
    )
    assert checkpointed.model.is_gradient_checkpointing
    batch = skewed_batch()
    advantages = compute_advantages(batch.rewards, batch.group_index)
    a = plain.accumulate_gradients(batch, advantages)
    b = checkpointed.accumulate_gradients(batch, advantages)
    assert a.loss == pytest.approx(b.loss, abs=TOLERANCE)
    assert_same_grads(plain, checkpointed)


def test_a_non_finite_loss_names_the_micro_batch_rows(tiny_model_path):
    from roll_async.errors import NonFiniteLossError

    trainer = GRPOTrainer(
        trainer_config(max_tokens_per_micro_batch=170), tiny_model_path
    )
    batch = skewed_batch()
    advantages = compute_advantages(batch.rewards, batch.group_index)
    advantages[1] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"micro-batch rows? 1\b") as info:
        trainer.accumulate_gradients(batch, advantages, step=4)
    assert "t-1" in info.value.traj_ids


def test_a_negative_budget_is_refused_by_the_trainer(tiny_model_path):
    with pytest.raises(ConfigError, match="trainer.max_tokens_per_micro_batch=-5"):
        GRPOTrainer(trainer_config(max_tokens_per_micro_batch=-5), tiny_model_path)


# -- config ------------------------------------------------------------------------------------------


def test_config_budget_below_sequence_length_fails_at_load_naming_both():
    with pytest.raises(ConfigError) as info:
        load_config(
            "configs/frozen_lake.yaml",
            ["sequence_length=1024", "trainer.max_tokens_per_micro_batch=512"],
        )
    message = str(info.value)
    assert message.startswith("trainer.max_tokens_per_micro_batch=512 is below")
    assert "sequence_length=1024" in message and "\n" not in message
    assert "raise it to at least sequence_length" in message


def test_config_negative_budget_fails_at_load():
    with pytest.raises(
        ConfigError, match=r"max_tokens_per_micro_batch=-1: must be >= 0"
    ):
        load_config(
            "configs/frozen_lake.yaml", ["trainer.max_tokens_per_micro_batch=-1"]
        )


def test_config_budget_at_least_sequence_length_loads():
    config = load_config(
        "configs/frozen_lake.yaml",
        ["sequence_length=1024", "trainer.max_tokens_per_micro_batch=4096"],
    )
    assert config.trainer.max_tokens_per_micro_batch == 4096
    assert (
        load_config("configs/frozen_lake.yaml").trainer.max_tokens_per_micro_batch == 0
    )


def test_a_vision_language_model_falls_back_to_padded_budget_micro_batches(caplog):
    """No packing for a VL model: rows grouped by the budget (not consecutive), padded, images by row index."""
    from roll_async.envs import make_env
    from roll_async.model.tiny_vl import build_tiny_vl_model
    from roll_async.prompts.images import ObservationEncoder, VisionProcessor
    from roll_async.prompts.prompt_builder import ChatPromptBuilder
    from roll_async.prompts.tokenizers import load_tokenizer

    path = str(build_tiny_vl_model())
    builder = ChatPromptBuilder(load_tokenizer(path), "You solve puzzles.")
    encoder = ObservationEncoder(VisionProcessor.load(path))
    env = make_env("sokoban", {"render_mode": "vision", "dim_room": [6, 6]})
    trajectories = []
    for i, reply_text in enumerate(
        ["<answer>Up</answer>" * 6, "Up", "Left " * 12, "No"]
    ):
        observation, info = env.reset(seed=i)
        first = encoder.encode(
            builder.first_turn_ids(
                info["instruction"] + "\n" + encoder.text(observation)
            ),
            observation,
        )
        reply = builder.encode(reply_text) + [builder.tokenizer.eos_token_id]
        ids = list(first.token_ids) + reply
        mask = [0] * len(first.token_ids) + [1] * len(reply)
        trajectories.append(
            Trajectory(
                tag="t",
                group_id=i // 2,
                episode_id=i,
                env_id=i,
                seed=i,
                traj_id=f"vl-{i}",
                created_step=0,
                token_ids=ids,
                response_mask=mask,
                logprobs=[-2.0 * m for m in mask],
                episode_reward=float(i % 2),
                images=list(first.images),
            )
        )
    batch = collate_trajectories(trajectories, pad_token_id=0)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    budget = lengths[0] + lengths[2]
    with caplog.at_level("WARNING", logger="roll_async.trainer.grpo_trainer"):
        fallback = GRPOTrainer(trainer_config(max_tokens_per_micro_batch=budget), path)
    assert not fallback.packing
    assert "padded to their longest row" in caplog.text
    assert fallback.plan(batch)[0].rows == (0, 2)
    per_row = GRPOTrainer(trainer_config(micro_batch_size=1), path)
    advantages = compute_advantages(batch.rewards, batch.group_index)
    a = per_row.accumulate_gradients(batch, advantages)
    b = fallback.accumulate_gradients(batch, advantages)
    assert a.loss == pytest.approx(b.loss, abs=TOLERANCE)
    assert_same_grads(per_row, fallback)
