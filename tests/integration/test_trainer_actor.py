"""trainer.placement=ray_actor: the trainer trains in a Ray actor with the GPUs Ray gives it; weights reach the engine.

The session's Ray has no GPUs, so the training run starts the actor with num_gpus=0;
``trainer_actor_gpu.py`` (a subprocess: a process joins one Ray instance) checks that
an actor asking for a GPU gets the logical GPU Ray offers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors

from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from tests.integration.test_train_pipeline import (  # noqa: F401 (fixture)
    fresh_weights,
    read_jsonl,
    train_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


async def test_sync_training_with_the_trainer_in_a_ray_actor(
    engine,
    ray_session,
    tmp_path,
    fresh_weights,  # noqa: F811 (the fixture)
):
    from roll_async.trainer.trainer_actor import TrainerActorClient

    config = train_config(
        tmp_path,
        "mode=sync",
        "max_steps=2",
        "trainer.placement=ray_actor",
        "trainer.num_gpus=0",
        "sft_warmup.enabled=true",
        "sft_warmup.steps=5",
        "sft_warmup.num_demos=8",
    )
    pipeline = AgenticPipeline(config, engines=[engine])
    run = await pipeline.run()

    client = pipeline.trainer
    assert isinstance(client, TrainerActorClient)
    assert client.placement["device"] == "cpu" and client.placement["gpu_ids"] == []
    # the actor reserves its CPU
    assert client.placement["assigned_resources"].get("CPU") == 1.0
    assert client.actor is None  # killed when the run ended
    metrics = read_jsonl(run / "metrics.jsonl")
    # SFT ran in the actor
    assert metrics[0]["step"] == -1 and math.isfinite(metrics[0]["sft/loss/last"])
    steps = metrics[1:]
    assert [m["step"] for m in steps] == [0, 1]
    # The engine got the actor's weights at start (after SFT) and after each step.
    assert steps[1]["weight_version"] == steps[0]["weight_version"] + 1
    for m in steps:
        assert all(
            math.isfinite(m[k])
            for k in ("train/loss", "train/grad_norm", "train/entropy")
        )
        # Sync mode: the engine sampled with exactly the trainer actor's weights, so engine and trainer logprobs
        # agree (importance ratio ~1; a stale or corrupted sync would move it).
        assert m["train/importance_ratio/max"] == pytest.approx(1.0, abs=1e-2)
    # The actor wrote the last step's checkpoint (same node here); a new trainer actor resumes from it.
    resumed = TrainerActorClient.start(config.trainer, pipeline.model_path)
    try:
        assert resumed.load_checkpoint(run / "checkpoints" / "step_1")["step"] == 1
    finally:
        resumed.shutdown()


def test_an_actor_asking_for_a_gpu_gets_the_one_ray_offers(tiny_model_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "integration" / "trainer_actor_gpu.py"),
            str(tiny_model_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(
        [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    )
    placement = result["placement"]
    assert placement["assigned_resources"].get("GPU") == 1.0 and placement[
        "gpu_ids"
    ] == ["0"]
    # A logical GPU has no CUDA device behind it here, so "auto" falls back to the CPU; with CUDA it is cuda.
    import torch

    assert placement["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    model_tensors = set(
        safetensors.safe_open(
            next(Path(tiny_model_path).glob("*.safetensors")), "pt"
        ).keys()
    )
    # the buckets the actor put hold the whole model
    assert set(result["bucket_tensors"]) == model_tensors
    assert (
        "trainer.num_gpus=2" in result["too_many_gpus"]
        and "has 1 GPU(s)" in result["too_many_gpus"]
    )
