"""The tokenizer and model directories reach a node that lacks them: shipped files written to a node-local cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll_async.engine.vllm_engine import VLLMEngine
from roll_async.errors import EngineStartupError
from roll_async.prompts.tokenizers import load_tokenizer
from roll_async.runtime.node_files import local_dir, model_files, tokenizer_files
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer


def test_a_node_without_the_path_loads_the_same_tokenizer_from_the_shipped_files(
    tmp_path,
):
    source = tmp_path / "driver_model"
    build_chatml_test_tokenizer(save_dir=source)
    # weights are never shipped
    (source / "model.safetensors").write_bytes(b"\0" * 1024)
    files = tokenizer_files(str(source))
    assert "tokenizer.json" in files and "model.safetensors" not in files
    missing = str(tmp_path / "not_on_this_node")
    here = local_dir(missing, files)
    assert here != missing
    text = "<answer>Up</answer>"
    assert load_tokenizer(here).encode(text) == load_tokenizer(str(source)).encode(text)
    assert local_dir(missing, files) == here  # cached by content


def test_an_existing_path_is_used_as_is(tmp_path):
    assert local_dir(str(tmp_path), {"tokenizer.json": b"{}"}) == str(tmp_path)
    assert tokenizer_files(str(tmp_path / "absent")) == {}


def test_an_engine_on_a_node_without_model_path_loads_the_shipped_model_files(tmp_path):
    """Engine side (no vLLM started): the directory a replica loads when its node lacks model.path."""
    source = tmp_path / "driver_model"
    build_chatml_test_tokenizer(save_dir=source)
    (source / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (source / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (source / "sub").mkdir()
    (source / "sub" / "extra.bin").write_bytes(b"nested")
    files = model_files(str(source))
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "sub/extra.bin",
    } <= set(files)

    here = VLLMEngine(str(source))
    # present: used as is
    assert here.model_dir_on_node() and here.use_model_dir_on_node(None) == str(source)

    elsewhere = VLLMEngine(str(tmp_path / "only_on_the_driver"))
    assert not elsewhere.model_dir_on_node()
    loaded = Path(elsewhere.use_model_dir_on_node(files))
    assert elsewhere.model_path == str(loaded) and elsewhere.model_dir_on_node()
    assert (loaded / "model.safetensors").read_bytes() == (
        source / "model.safetensors"
    ).read_bytes()
    assert (loaded / "sub" / "extra.bin").read_bytes() == b"nested"
    assert load_tokenizer(str(loaded)).encode("Up") == load_tokenizer(
        str(source)
    ).encode("Up")

    nowhere = VLLMEngine(str(tmp_path / "on_no_node"))
    with pytest.raises(
        EngineStartupError,
        match=r"model.path '.*on_no_node' does not exist on node .*shares",
    ):
        nowhere.use_model_dir_on_node(None)
    # a hub id: nothing to ship
    assert VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct").model_dir_on_node()
