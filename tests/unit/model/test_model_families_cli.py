"""Bad input before any actor starts: unknown --family, unusable templates, unknown architectures; the
prefix-mismatch metric from an EnvManager's episodes (fake engine)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.errors import ConfigError
from roll_async.model.families import FAMILIES, QWEN3_TEMPLATE

REPO = Path(__file__).resolve().parents[3]
DROPS_ASSISTANT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "roll_async.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_unknown_family_is_a_one_line_error_listing_the_families():
    result = run_cli("make-tiny-model", "--family", "gpt5")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown --family 'gpt5'" in lines[0]
    assert all(name in lines[0] for name in FAMILIES)


def test_check_model_fails_clearly_on_a_template_that_drops_assistant_content(
    tiny_model_path, tmp_path
):
    template = tmp_path / "drops.jinja"
    template.write_text(DROPS_ASSISTANT)
    result = run_cli(
        "check-model", str(tiny_model_path), "--chat-template", str(template)
    )
    assert result.returncode == 1
    assert (
        "drops assistant content" in result.stdout
        and "fix: set model.chat_template" in result.stdout
    )
    assert "vLLM load" not in result.stdout  # failed before any engine started


def test_check_model_needs_a_model_directory(tmp_path):
    result = run_cli("check-model", str(tmp_path))
    assert result.returncode == 1 and "has no config.json" in result.stdout


def _config(model_path: str, **model) -> PipelineConfig:
    config = PipelineConfig(
        custom_envs={
            "Sokoban": CustomEnvConfig(
                env_type="sokoban", env_config={"dim_room": [6, 6], "num_boxes": 1}
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["Sokoban"]
        ),
        rollout_batch_size=2,
    )
    config.model.path = model_path
    for key, value in model.items():
        setattr(config.model, key, value)
    validate_config(config)
    return config


@pytest.fixture()
def model_copy(tiny_model_path, tmp_path) -> Path:
    """The tiny model's config and tokenizer (no weights: preflight does not load them)."""
    out = tmp_path / "model"
    out.mkdir()
    for file in Path(tiny_model_path).iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    return out


def test_preflight_refuses_a_template_that_drops_assistant_content(
    model_copy, tmp_path
):
    from roll_async.pipelines.preflight import preflight

    template = tmp_path / "drops.jinja"
    template.write_text(DROPS_ASSISTANT)
    with pytest.raises(
        ConfigError, match="drops assistant content.*model.chat_template"
    ):
        preflight(_config(str(model_copy), chat_template=str(template)))


def test_preflight_refuses_a_tokenizer_without_template_and_accepts_model_chat_template(
    model_copy, tmp_path
):
    from roll_async.pipelines.preflight import preflight

    tokenizer_config = model_copy / "tokenizer_config.json"
    data = json.loads(tokenizer_config.read_text())
    data.pop("chat_template", None)
    tokenizer_config.write_text(json.dumps(data))
    (model_copy / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="no chat template.*model.chat_template"):
        preflight(_config(str(model_copy)))
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_TEMPLATE)
    _, tokenizer = preflight(_config(str(model_copy), chat_template=str(template)))
    assert tokenizer is not None


def test_preflight_refuses_an_architecture_nobody_can_load(model_copy):
    from roll_async.pipelines.preflight import preflight

    config_file = model_copy / "config.json"
    data = json.loads(config_file.read_text())
    data["architectures"] = ["NoSuchModelForCausalLM"]
    config_file.write_text(json.dumps(data))
    with pytest.raises(
        ConfigError, match="transformers .*architecture NoSuchModelForCausalLM"
    ):
        preflight(_config(str(model_copy)))


@pytest.mark.parametrize("template, expected", [(None, 0.0), (QWEN3_TEMPLATE, 1.0)])
async def test_prefix_mismatch_rate_is_zero_for_append_only_and_one_for_think_stripping(
    template, expected, tmp_path
):
    """The Qwen3 template comes in through model.chat_template (a file), as a user would override one."""
    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.metrics import PREFIX_MISMATCH_RATE
    from roll_async.scheduler.local import LocalRolloutScheduler
    from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
    from roll_async.testing.fake_engine import FakeEngine
    from roll_async.testing.scripted_envs import scripted_env_factory

    tokenizer = build_chatml_test_tokenizer()
    reply = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    config = PipelineConfig(
        custom_envs={
            "count": CustomEnvConfig(
                env_type="scripted", env_config={"episode_length": 3}, max_steps=5
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2, group_size=1, tags=["count"]
        ),
        rollout_batch_size=2,
    )
    if template is not None:
        (tmp_path / "qwen3.jinja").write_text(template)
        config.model.chat_template = str(tmp_path / "qwen3.jinja")
    validate_config(config)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(lambda r: reply),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    try:
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 30)
    finally:
        await scheduler.shutdown()
    assert all(t.num_turns == 3 for t in batch)
    assert metrics[PREFIX_MISMATCH_RATE] == expected
