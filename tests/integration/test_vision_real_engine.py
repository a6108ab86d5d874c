"""Vision-language rollouts against the real vLLM CPU engine and the GRPO trainer on the tiny VL model.

One engine for the module (the tiny Idefics3 model, in-process). A 3-turn sokoban episode in
``render_mode: vision`` must send its images to the engine (checked on the engine side), its ids must
be exactly the prompt vLLM built from them, the trainer's logprobs (with the vision tower) must match
the engine's on the generated tokens, and a training step plus a weight sync must run.
"""

from __future__ import annotations

import asyncio

import pytest

from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    GenerationConfig,
    TrainerConfig,
)
from roll_async.env_managers.env_manager import EnvManager, EnvManagerSettings
from roll_async.envs import make_env
from roll_async.prompts.images import ObservationEncoder, VisionProcessor
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import load_tokenizer
from roll_async.trajectory import EpisodeSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Engine vs trainer logprob agreement on generated tokens (float32 both sides), as for text models.
LOGPROB_TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def vl_model_path() -> str:
    from roll_async.model.tiny_vl import build_tiny_vl_model

    return str(build_tiny_vl_model())


@pytest.fixture(scope="module")
async def vl_engine(vl_model_path):
    from roll_async.engine.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        vl_model_path,
        EngineConfig(
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=8,
            cpu_kv_cache_space_gib=0.25,
            engine_kwargs={"limit_mm_per_prompt": {"image": 8}},
        ),
    )
    await engine.start()
    yield engine
    await engine.shutdown()


class _Episodes:
    def __init__(self, seeds: list[int]) -> None:
        self.seeds = list(seeds)
        self.trajectories = []

    async def next_episode(self, env_id):
        if not self.seeds:
            return None
        seed = self.seeds.pop(0)
        return EpisodeSpec(
            tag="VisionSokoban", group_id=seed, episode_id=0, seed=seed, created_step=0
        )

    async def put_trajectory(self, trajectory):
        self.trajectories.append(trajectory)


async def _play(engine, vl_model_path, seeds: list[int], max_steps: int = 3):
    custom = CustomEnvConfig(
        env_type="sokoban",
        env_config={"dim_room": [6, 6], "num_boxes": 1, "render_mode": "vision"},
        max_steps=max_steps,
        max_tokens_per_step=12,
        stop=[],
    )
    vision = VisionProcessor.load(vl_model_path)
    episodes = _Episodes(seeds)
    manager = EnvManager(
        0,
        EnvManagerSettings(
            tag="VisionSokoban",
            custom_env=custom,
            sequence_length=1000,
            generation=GenerationConfig(),
        ),
        make_env=lambda cfg: make_env("sokoban", cfg),
        scheduler=episodes,
        engine=engine,
        prompt_builder=ChatPromptBuilder(
            load_tokenizer(vl_model_path), custom.system_prompt
        ),
        observations=ObservationEncoder(vision),
    )
    await asyncio.wait_for(manager.run_rollout_loop(), 600)
    return episodes.trajectories, vision


async def test_three_turn_vision_episode_reaches_engine_and_trainer(
    vl_engine, vl_model_path
):
    import torch

    from roll_async.trainer.collate import collate_trajectories
    from roll_async.trainer.grpo_trainer import GRPOTrainer

    before = vl_engine.stats()["images_received"]
    trajectories, vision = await _play(vl_engine, vl_model_path, seeds=[3, 4])
    assert len(trajectories) == 2
    trajectory = trajectories[0]
    assert trajectory.stop_reason == "max_steps" and trajectory.num_turns == 3, (
        trajectory.error
    )
    # One image per observation: the first prompt's and one after each of the first two steps.
    assert len(trajectory.images) == 3 and [t.num_images for t in trajectory.turns] == [
        1,
        1,
        1,
    ]
    for start, end in trajectory.image_spans:
        assert trajectory.token_ids[start:end].count(vision.image_token_id) == 4
    # The image token is input-only: the engine never samples it (a random-init model otherwise would).
    for t in trajectories:
        assert t.token_ids.count(vision.image_token_id) == 4 * len(t.images)

    # Engine side: every turn's request carried all images so far (1 + 2 + 3 per episode) ...
    assert vl_engine.stats()["images_received"] - before == 2 * (1 + 2 + 3)
    # ... and the prompt vLLM built from the compact ids + images is exactly the trajectory's ids.
    prompts = dict(vl_engine.recent_multimodal_prompts())
    last_turn = [
        rid
        for rid in prompts
        if trajectory.traj_id in rid and rid.split("-t")[-1].startswith("2-")
    ]
    assert len(last_turn) == 1
    engine_prompt = prompts[last_turn[0]]
    assert engine_prompt == trajectory.token_ids[: len(engine_prompt)]
    generated_last = trajectory.turns[-1].generated_tokens
    assert len(engine_prompt) + generated_last == len(trajectory.token_ids)

    # Trainer side: logprobs with the vision tower agree with the engine's on generated tokens.
    trainer = GRPOTrainer(
        TrainerConfig(device="cpu", dtype="float32", lr=1e-3, micro_batch_size=2),
        vl_model_path,
    )
    tokenizer = load_tokenizer(vl_model_path)
    batch = collate_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)
    assert [len(row) for row in batch.images] == [3, 3]
    trainer_logprobs = trainer.compute_logprobs(batch)
    mask = batch.response_mask.bool()
    diff = (trainer_logprobs[mask] - batch.old_logprobs[mask]).abs()
    assert int(mask.sum()) > 0 and float(diff.max()) < LOGPROB_TOLERANCE, float(
        diff.max()
    )
    print(
        f"engine vs trainer logprobs on {int(mask.sum())} generated tokens: max |diff| {float(diff.max()):.2e}"
    )
    # Without the images the same ids score differently: the vision tower is really in the loss path.
    blind = batch.to("cpu")
    blind.images = []
    blind_diff = (trainer.compute_logprobs(blind)[mask] - trainer_logprobs[mask]).abs()
    assert float(blind_diff.max()) > 10 * LOGPROB_TOLERANCE

    # One training step, then the new weights (vision tower included) go to the engine.
    metrics = trainer.train_step(batch, step=0)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    await vl_engine.update_weights(trainer.state_dict_for_engine(), version=1)
    # The same seed as before: its images are in vLLM's encoder cache, which the sync must invalidate.
    after_sync, _ = await _play(vl_engine, vl_model_path, seeds=[3], max_steps=2)
    batch = collate_trajectories(after_sync, pad_token_id=tokenizer.pad_token_id)
    mask = batch.response_mask.bool()
    diff = (trainer.compute_logprobs(batch)[mask] - batch.old_logprobs[mask]).abs()
    assert after_sync[0].newest_weight_version == 1
    assert float(diff.max()) < LOGPROB_TOLERANCE, float(diff.max())
