"""trainer.strategy=fsdp2 on Ray: two CPU ranks in a placement group train against the real engine.

After every weight sync the engine serves the ranks' weights: with
``max_token_lag=0`` only tokens sampled by the trainer's current weights are
scored, so their importance ratio (trainer ÷ engine probability) is 1 within the
float32 CPU tolerance of the other integration tests. The run's Hugging Face
export (written layer by layer by the main rank) must load in transformers and
pass ``roll-async check-model``, which loads it in vLLM.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from tests.integration.test_train_pipeline import (  # noqa: F401 (fixture)
    fresh_weights,
    read_jsonl,
    train_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_async_run_on_two_fsdp_ranks_keeps_engine_and_trainer_in_step(
    engine,
    ray_session,
    tmp_path,
    fresh_weights,  # noqa: F811 (the fixture)
):
    from transformers import AutoModelForCausalLM

    from roll_async.trainer.ranks.rank_group import TrainerRankGroup

    config = train_config(
        tmp_path,
        "mode=async",
        "max_staleness=1",
        "max_steps=3",
        "trainer.strategy=fsdp2",
        "trainer.num_ranks=2",
        "trainer.max_token_lag=0",
        "checkpoint.export_hf_interval=3",
    )
    pipeline = AgenticPipeline(config, engines=[engine])
    run = await pipeline.run()

    group = pipeline.trainer
    assert isinstance(group, TrainerRankGroup)
    assert [p["rank"] for p in group.placements] == [0, 1]
    assert len({p["pid"] for p in group.placements}) == 2
    assert group.actors == []  # stopped when the run ended
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    scored = [m for m in metrics if m["train/response_tokens"] > 0]
    assert len(scored) >= 2
    for m in scored:
        assert m["train/importance_ratio/max"] == pytest.approx(1.0, abs=1e-2)
        assert m["train/importance_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    versions = [m["weight_version"] for m in metrics]
    assert versions[-1] == versions[0] + 2

    exported = run / "hf" / "step_2"
    assert (exported / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert model.config.num_hidden_layers == 2
    check = subprocess.run(
        [sys.executable, "-m", "roll_async.cli", "check-model", str(exported)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
