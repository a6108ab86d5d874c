"""The tokenizer directory reaches a node that lacks it: shipped files written to a node-local cache."""

from __future__ import annotations

from env_managers.testing import build_chatml_test_tokenizer
from roll_async.node_files import local_dir, tokenizer_files
from roll_async.tokenization import load_tokenizer


def test_a_node_without_the_path_loads_the_same_tokenizer_from_the_shipped_files(tmp_path):
    source = tmp_path / "driver_model"
    build_chatml_test_tokenizer(save_dir=source)
    (source / "model.safetensors").write_bytes(b"\0" * 1024)  # weights are never shipped
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
