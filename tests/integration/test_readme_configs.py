"""The other runs the README and docs show, run for real: async, rollout, an agent, fsdp2 ranks, LoRA, vision.

Each starts its own Ray and vLLM through the CLI, shortened only by overrides; helpers and the command
list in readme_runs.py.
"""

from __future__ import annotations

import json
import time

import pytest
from transformers import AutoModelForCausalLM

from tests.integration.readme_runs import (
    SHORT,
    SHORT_SFT,
    assert_trained,
    cli,
    main_sh,
    metrics,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# -- the other documented runs ----------------------------------------------------------------------


def test_main_job_async(tmp_path):
    run = tmp_path / "async"
    out = main_sh(
        "mode=async", "max_staleness=1", *SHORT, *SHORT_SFT, f"output_dir={run}"
    )
    (trained,) = assert_trained(out, run)
    assert "mode: async" in (run / "config.yaml").read_text()
    assert "rollout/staleness/max" in trained


def test_rollout_sokoban(tmp_path):
    """``roll-async rollout``: batches only, with the metrics and per-turn trajectory records users read."""
    run = tmp_path / "rollout"
    short = [o for o in SHORT if not o.startswith(("max_steps=", "trainer."))]
    started = time.time()
    out = cli(
        "rollout", "configs/sokoban.yaml", "num_batches=2", *short, f"output_dir={run}"
    )
    assert "step 1:" in out, out[-3000:]
    assert "num_batches: 2" in (run / "config.yaml").read_text()
    steps = metrics(run)
    assert [m["step"] for m in steps] == [0, 1], out[-3000:]
    assert {
        "rollout/trajectories_per_s",
        "rollout/tokens_per_s",
        "rollout/get_batch_wait_s",
        "rollout/turns/mean",
        "rollout/staleness/max",
    } <= set(steps[0])
    assert not (run / "checkpoints").exists()
    records = [
        json.loads(line)
        for line in (run / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(records) == 16
    for record in records:
        assert {
            "tag",
            "group_id",
            "episode_id",
            "env_id",
            "seed",
            "traj_id",
            "episode_reward",
            "stop_reason",
            "created_step",
            "oldest_weight_version",
            "newest_weight_version",
            "started_at",
            "finished_at",
            "turns",
            "text",
        } <= set(record)
        assert started < record["started_at"] <= record["finished_at"]
        for turn in record["turns"]:
            assert {
                "action_text",
                "observation",
                "reward",
                "generated_tokens",
                "weight_version",
                "generate_s",
                "env_step_s",
            } <= set(turn)


def test_agent_config_trains(tmp_path):
    run = tmp_path / "agent"
    out = cli("train", "configs/agent_frozen_lake.yaml", *SHORT, f"output_dir={run}")
    assert_trained(out, run)


def test_fsdp2_on_two_ranks(tmp_path):
    """Two steps, so the engine serves the ranks' weights once: the next step's importance ratio (trainer
    over engine probability) is 1 within float32 CPU tolerance; the Hugging Face export, written layer by
    layer by the main rank, loads in transformers."""
    run = tmp_path / "fsdp2"
    out = cli(
        "train",
        "configs/default.yaml",
        "trainer.strategy=fsdp2",
        "trainer.num_ranks=2",
        *SHORT,
        *SHORT_SFT,
        "max_steps=2",
        "checkpoint.export_hf_interval=2",
        f"output_dir={run}",
    )
    trained = assert_trained(out, run, steps=2)
    assert "trainer: 2 fsdp2 rank(s)" in (run / "logs" / "driver.log").read_text()
    assert "SIGTERM handler is not set" not in out  # Ray was started on the main thread
    after_sync = trained[1]
    assert after_sync["weight_version"] == trained[0]["weight_version"] + 1
    assert after_sync["train/response_tokens"] > 0
    assert after_sync["train/importance_ratio/max"] == pytest.approx(1.0, abs=1e-2)
    assert after_sync["train/importance_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    exported = run / "hf" / "step_1"
    assert (exported / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert model.config.num_hidden_layers == 2


# -- the ready configs the README names without a command line --------------------------------------


def test_lora_config_trains_the_adapter(tmp_path):
    run = tmp_path / "lora"
    out = cli("train", "configs/lora.yaml", *SHORT, *SHORT_SFT, f"output_dir={run}")
    assert_trained(out, run)
    checkpoint = run / "checkpoints" / "step_0"
    assert list(checkpoint.rglob("adapter_config.json")), sorted(
        p.name for p in checkpoint.rglob("*")
    )


def test_vision_config_trains(tmp_path):
    run = tmp_path / "vision"
    out = cli("train", "configs/sokoban_vision.yaml", *SHORT, f"output_dir={run}")
    assert_trained(out, run)
    assert list((run / "images").rglob("*.png")), "what the model saw is kept as PNG"
