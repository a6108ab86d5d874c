"""Tied aliases are the names the model declares tied, also for the fsdp2 ranks' meta-built model.

fsdp2 ranks build the model on the meta device (roll_async.trainer.model_loading),
where every tensor's ``data_ptr`` is 0. The fallback transformers 4 took keyed
tensors by storage pointer, so 20 of the tiny model's 27 names counted as tied
aliases and were never synced to the engines or exported.
"""

from __future__ import annotations

import pytest
import torch
import transformers.modeling_utils
from transformers import AutoConfig, AutoModelForCausalLM

from roll_async.config.schema import LoraConfig
from roll_async.trainer.checkpoint import checkpoint_state_dict, tied_parameter_names
from roll_async.trainer.lora import apply_lora
from roll_async.trainer.model_loading import empty_causal_lm


def as_on_transformers_4(model: torch.nn.Module, monkeypatch) -> None:
    """What transformers 4 offers: no remove_tied_weights_from_state_dict, no expanded ``all_tied_weights_keys``.

    ``_tied_weights_keys`` stays (4.x: a list of names; 5.x: a dict keyed by them).
    """
    monkeypatch.delattr(
        transformers.modeling_utils, "remove_tied_weights_from_state_dict"
    )
    for module in model.modules():
        if "all_tied_weights_keys" in vars(module):
            monkeypatch.delattr(module, "all_tied_weights_keys")


def untied_meta_model(model_path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(model_path)
    config.tie_word_embeddings = False
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("transformers_api", ["5.x", "4.x"])
def test_the_meta_model_drops_exactly_the_tied_head(
    tiny_model_path, monkeypatch, transformers_api
):
    model = empty_causal_lm(str(tiny_model_path), torch.float32)
    assert all(t.is_meta for t in model.state_dict().values())
    if transformers_api == "4.x":
        as_on_transformers_4(model, monkeypatch)
    names = set(model.state_dict())
    assert len(names) > 20
    assert tied_parameter_names(model) == {"lm_head.weight"}
    assert set(checkpoint_state_dict(model)) == names - {"lm_head.weight"}


@pytest.mark.parametrize("transformers_api", ["5.x", "4.x"])
def test_an_untied_meta_model_drops_nothing(
    tiny_model_path, monkeypatch, transformers_api
):
    model = untied_meta_model(tiny_model_path)
    if transformers_api == "4.x":
        as_on_transformers_4(model, monkeypatch)
    assert tied_parameter_names(model) == set()
    assert set(checkpoint_state_dict(model)) == set(model.state_dict())


def test_a_peft_wrapped_model_finds_its_prefixed_head(tiny_model_path):
    model = empty_causal_lm(str(tiny_model_path), torch.float32)
    wrapped = apply_lora(model, LoraConfig(rank=4))
    assert tied_parameter_names(wrapped) == {"base_model.model.lm_head.weight"}
