"""The agentic training pipeline end to end on CPU with the real engine: sync and async, resume, NaN stop."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError, TrainerRankTimeoutError
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.trajectory import GenerationRequest
from tests.integration.short_runs import IN_PROCESS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def train_config(tmp_path: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "sokoban.yaml",
        [
            f"output_dir={tmp_path}",
            "max_steps=3",
            *IN_PROCESS,
            "custom_envs.SimpleSokoban.max_steps=2",
            "custom_envs.SimpleSokoban.max_tokens_per_step=16",
            *overrides,
        ],
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
async def fresh_weights(engine, tiny_model_path):
    """Give the shared engine the tiny model's own weights back after a training run changed them."""
    yield
    from safetensors.torch import load_file

    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    version = await engine.get_weight_version.remote()
    await engine.pause.remote("wait")
    await engine.update_weights.remote(original, version + 1)
    await engine.resume.remote()


async def greedy(engine, tokenizer) -> list[int]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Push the box.\n######\n#_P_X_#"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    result = await engine.generate.remote(
        GenerationRequest(
            request_id=f"greedy-{len(prompt)}-{id(prompt)}",
            prompt_token_ids=prompt,
            max_tokens=12,
            temperature=0.0,
            ignore_eos=True,
        )
    )
    return result.output_token_ids


async def test_sync_training_versions_rise_outputs_change_and_loops_pause(
    engine, tokenizer, tmp_path, fresh_weights
):
    import torch

    before = await greedy(engine, tokenizer)
    config = train_config(
        tmp_path,
        "mode=sync",
        "checkpoint.save_interval=1",
        "sft_warmup.enabled=true",
        "sft_warmup.steps=10",
        "sft_warmup.num_demos=8",
    )
    pipeline = AgenticPipeline(config, engines=[engine])
    run = await pipeline.run()
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics if m["step"] >= 0] == [0, 1, 2]
    assert (
        metrics[0]["step"] == -1
        and metrics[0]["sft/loss/last"] < metrics[0]["sft/loss/first"]
    )
    metrics = metrics[1:]
    versions = [m["weight_version"] for m in metrics]
    assert versions == [versions[0], versions[0] + 1, versions[0] + 2]
    assert all(m["train/loss"] is not None for m in metrics)
    assert {
        "time/step_rollout",
        "time/step_train",
        "time/step_weight_sync",
        "time/step_total",
    } <= set(metrics[0])
    after = await greedy(engine, tokenizer)
    assert after != before, "the engine still serves the old weights"
    # The engine serves exactly the trainer's weights: its logprobs of what it sampled match the
    # trainer's own logprobs of the same tokens (both float32).
    model = pipeline.trainer.model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Push the box.\n######\n#_P_X_#"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    sampled = await engine.generate.remote(
        GenerationRequest(
            request_id="after-train-sample",
            prompt_token_ids=prompt,
            max_tokens=16,
            temperature=1.0,
            seed=3,
            ignore_eos=True,
        )
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt + sampled.output_token_ids])).logits[
            0, len(prompt) - 1 : -1
        ]
        trainer_logprobs = torch.log_softmax(logits.float(), dim=-1)
        trainer_logprobs = trainer_logprobs.gather(
            1, torch.tensor(sampled.output_token_ids)[:, None]
        )[:, 0]
    assert trainer_logprobs.tolist() == pytest.approx(sampled.logprobs, abs=2e-3)
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 12
    for record in trajectories:
        assert record["served_step"] == record["created_step"]  # sync: on-policy
        if record["served_step"] > 0:
            previous = metrics[record["served_step"] - 1]
            assert record["started_at"] >= previous["timestamp/train_end"], (
                "sync mode generated during training"
            )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_1",
        "step_2",
    ]  # keep_last=2
    assert (run / "config.yaml").is_file()


async def test_async_training_overlaps_rollout_with_training_within_staleness(
    engine, tmp_path, fresh_weights
):
    config = train_config(
        tmp_path,
        "mode=async",
        "max_staleness=1",
        "max_steps=4",
        "eval_steps=2",
        "val_env_manager.num_env_groups=2",
    )
    run = await AgenticPipeline(config, engines=[engine]).run()
    metrics = read_jsonl(run / "metrics.jsonl")
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    # validation every eval_steps, with per-tag metrics
    assert [("val/SimpleSokoban/episode_reward" in m) for m in metrics] == [
        False,
        True,
        False,
        True,
    ]
    assert all(0 <= r["served_step"] - r["created_step"] <= 1 for r in trajectories)
    assert all(m["rollout/staleness/max"] <= 1 for m in metrics)
    overlapping = [
        r
        for r in trajectories
        if r["served_step"] > 0
        and r["started_at"] < metrics[r["served_step"] - 1]["timestamp/train_end"]
        and r["finished_at"] > metrics[r["served_step"] - 1]["timestamp/train_start"]
    ]
    assert overlapping, "no trajectory was generated while the trainer trained"
    versions = [m["weight_version"] for m in metrics]
    assert versions == sorted(versions) and versions[-1] == versions[0] + 3
    newest = [r["newest_weight_version"] for r in trajectories]
    assert max(newest) > min(newest), "rollouts never used updated weights"


async def test_resume_continues_from_the_saved_step_with_new_seeds(
    engine, tmp_path, fresh_weights
):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    await AgenticPipeline(
        train_config(
            first_dir, "mode=sync", "max_steps=2", "checkpoint.save_interval=1"
        ),
        engines=[engine],
    ).run()
    resumed = await AgenticPipeline(
        train_config(
            second_dir,
            "mode=sync",
            "max_steps=4",
            f"checkpoint.resume_from={first_dir}",
        ),
        engines=[engine],
    ).run()
    metrics = read_jsonl(resumed / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [2, 3]
    first_seeds = {r["seed"] for r in read_jsonl(first_dir / "trajectories.jsonl")}
    resumed_records = read_jsonl(resumed / "trajectories.jsonl")
    assert all(r["created_step"] >= 2 for r in resumed_records)
    assert not first_seeds & {r["seed"] for r in resumed_records}, (
        "a resumed run replayed seeds already trained on"
    )
    state = json.loads(
        (first_dir / "checkpoints" / "step_1" / "trainer_state.json").read_text()
    )
    assert state["last_step"] == 1


class PoisonedPipeline(AgenticPipeline):
    """Turns the policy's weights into NaN before step 1 trains, as a diverging run would."""

    def _prepare_trainer(self):
        metrics = super()._prepare_trainer()
        train_step = self.trainer.train_step

        def poisoned(batch, step):
            if step == 1:
                import torch

                with torch.no_grad():
                    next(self.trainer.model.parameters()).fill_(float("nan"))
            return train_step(batch, step)

        self.trainer.train_step = poisoned
        return metrics


async def test_nan_loss_stops_the_run_naming_step_and_batch_and_keeps_the_checkpoint(
    engine, tmp_path, fresh_weights
):
    from roll_async.errors import NonFiniteLossError

    config = train_config(tmp_path, "mode=sync", "checkpoint.save_interval=1")
    with pytest.raises(NonFiniteLossError) as caught:
        await PoisonedPipeline(config, engines=[engine]).run()
    message = str(caught.value)
    assert "step 1" in message and "last good checkpoint: step 0" in message
    assert "SimpleSokoban" in message  # the batch's trajectory ids are named
    assert (tmp_path / "checkpoints" / "step_0").is_dir()
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [0]


def test_a_model_the_trainer_cannot_load_fails_before_any_actor(
    tmp_path, tiny_model_path
):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_path, broken)
    next(broken.glob("*.safetensors")).write_bytes(b"not a safetensors file")
    config = train_config(tmp_path / "run", f"model.path={broken}")
    pipeline = AgenticPipeline(config)
    with pytest.raises(ConfigError, match="model.path=.*broken-model.*cannot load"):
        pipeline._prepare_trainer()
    assert pipeline.engines == [] and pipeline.train_scheduler is None


def test_ranks_hung_while_joining_fail_as_a_timeout_not_as_a_model_that_cannot_load(
    tmp_path, tiny_model_path, monkeypatch
):
    def hung(config, model_path, ensure_ray):
        raise TrainerRankTimeoutError("join", [1], 2, 3600.0)

    monkeypatch.setattr(
        "roll_async.pipelines.agentic_pipeline.build_placed_trainer", hung
    )
    pipeline = AgenticPipeline(train_config(tmp_path / "run"))
    with pytest.raises(
        TrainerRankTimeoutError, match=r"ranks \[1\] of 2 did not answer join"
    ):
        pipeline._prepare_trainer()
