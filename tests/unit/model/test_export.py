"""roll-async export: a run's checkpoint as a Hugging Face model directory transformers loads."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll_async.cli import main
from roll_async.config.schema import TrainerConfig
from roll_async.trainer import GRPOTrainer
from tests.unit.trainer.test_trainer_checkpoint import make_batch

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def test_export_writes_a_model_directory_transformers_loads(
    tiny_model_path, tokenizer, tmp_path, capsys
):
    run = tmp_path / "run"
    trainer = GRPOTrainer(TrainerConfig(device="cpu", lr=1e-3), tiny_model_path)
    for step in range(2):
        trainer.train_step(make_batch(tokenizer, step), step=step)
        trainer.save_checkpoint(run / "checkpoints" / f"step_{step}", {"step": step})
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    (run / "config.yaml").write_text(
        f"model:\n  path: {tiny_model_path}\n  chat_template: {template}\n"
    )

    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0  # newest: step 1
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json"} <= names
    assert any(n.endswith(".safetensors") for n in names)
    assert not names & {"optimizer.pt", "extra_state.pt", "trainer_state.json"}
    model = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trainer.model.state_dict()[name]), name
    exported = AutoTokenizer.from_pretrained(out)
    assert exported.chat_template == TEMPLATE  # the run's model.chat_template
    assert exported.eos_token_id == tokenizer.eos_token_id
    assert (
        json.loads((out / "generation_config.json").read_text())["eos_token_id"]
        is not None
    )

    step0 = tmp_path / "step0"
    assert main(["export", str(run), "--step", "0", "--out", str(step0)]) == 0
    assert not torch.equal(
        AutoModelForCausalLM.from_pretrained(step0).model.norm.weight,
        model.model.norm.weight,
    )
    capsys.readouterr()


def test_export_of_a_missing_step_is_a_one_line_error_before_any_file(
    tiny_model_path, tmp_path, capsys
):
    run = tmp_path / "run"
    trainer = GRPOTrainer(TrainerConfig(device="cpu"), tiny_model_path)
    trainer.save_checkpoint(run / "checkpoints" / "step_3", {"step": 3})
    out = tmp_path / "export"
    assert main(["export", str(run), "--step", "7", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "step 7" in err and "3" in err
    assert not out.exists()
    assert main(["export", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert not out.exists()
