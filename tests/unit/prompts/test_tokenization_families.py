"""Token-exact turns for the zoo's family templates (Qwen2.5, Qwen3 think stripping, Llama-3 BOS, Mistral
system merge, Gemma without system role, Phi-3): each delta is what the template renders for one more turn."""

from __future__ import annotations

import pytest

from roll_async.model.families import FAMILIES
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.testing.family_tokenizers import build_family_test_tokenizer

SYSTEM = "You are an agent."


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_tokenizer(request):
    return request.param, build_family_test_tokenizer(request.param)


def _conversation(builder: ChatPromptBuilder):
    users = ["grid 1", "grid 2", "grid 3"]
    generated = [
        builder.encode(builder.reply_prefix() + r) + builder.closure_ids[:1]
        for r in ("<answer>Up</answer>", "<answer>Left</answer>")
    ]
    return users, generated, builder.incremental_ids(users, generated)


APPEND_ONLY = {"qwen2_5", "llama3", "gemma3", "phi3"}


@pytest.mark.parametrize("system", [SYSTEM, None])
def test_incremental_ids_are_the_templates_render_for_append_only_families(
    family_tokenizer, system
):
    name, tokenizer = family_tokenizer
    builder = ChatPromptBuilder(tokenizer, system)
    users, generated, ids = _conversation(builder)
    fresh = builder.fresh_render_text(users, generated)
    if name in APPEND_ONLY or (name == "mistral" and system is None):
        assert ids == builder.encode(fresh), name
        assert builder.describe().append_only
    else:
        assert builder.fresh_render_differs(ids, users, generated)
        assert not builder.describe().append_only
    # Every turn ends with the template's own generation prompt, whatever the history looks like.
    last_turn = builder._render(
        builder._system() + [{"role": "user", "content": "grid 3"}], True
    )
    assert tokenizer.decode(ids).endswith(last_turn[last_turn.rindex("grid 3") :])


def test_qwen3_think_stripping_keeps_the_models_ids_and_takes_the_next_turn_from_the_template():
    tokenizer = build_family_test_tokenizer("qwen3")
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    reply = builder.encode("<think>\nplan\n</think>\n\n<answer>Up</answer>") + [
        tokenizer.eos_token_id
    ]
    delta = builder.closure_ids_after(reply) + builder.user_delta_ids("grid 2")
    assert (
        tokenizer.decode(delta)
        == "\n<|im_start|>user\ngrid 2<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = builder.first_turn_ids("grid 1") + reply + delta
    # the model's own ids stay in the context
    assert "<think>\nplan\n</think>" in tokenizer.decode(ids)
    assert builder.fresh_render_differs(
        ids, ["grid 1", "grid 2"], [reply]
    )  # a fresh render strips the think block
    assert "think stripping" in " ".join(builder.describe().notes)


def test_qwen3_enable_thinking_false_changes_the_generation_prompt_of_every_turn():
    tokenizer = build_family_test_tokenizer("qwen3")
    builder = ChatPromptBuilder(
        tokenizer, SYSTEM, template_kwargs={"enable_thinking": False}
    )
    assert tokenizer.decode(builder.user_delta_ids("g")).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert tokenizer.decode(builder.first_turn_ids("g")).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_mistral_system_prompt_is_rendered_once_not_per_turn():
    tokenizer = build_family_test_tokenizer("mistral")
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    assert (
        tokenizer.decode(builder.first_turn_ids("grid 1"))
        == f"<s>[INST] {SYSTEM}\n\ngrid 1[/INST]"
    )
    assert tokenizer.decode(builder.user_delta_ids("grid 2")) == "[INST] grid 2[/INST]"
    assert (
        builder.closure_ids_after(builder.encode(" Up") + [tokenizer.eos_token_id])
        == []
    )


def test_gemma_has_no_system_role_and_bos_only_once():
    tokenizer = build_family_test_tokenizer("gemma3")
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    assert tokenizer.decode(builder.first_turn_ids("g1")).startswith(
        f"<bos><start_of_turn>user\n{SYSTEM}\n\ng1"
    )
    assert (
        tokenizer.decode(builder.user_delta_ids("g2"))
        == "<start_of_turn>user\ng2<end_of_turn>\n<start_of_turn>model\n"
    )


def test_phi3_closure_stops_at_the_turn_end_not_inside_the_next_tag():
    builder = ChatPromptBuilder(build_family_test_tokenizer("phi3"), SYSTEM)
    assert builder.tokenizer.decode(builder.closure_ids) == "<|end|>\n"


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3"])
def test_tool_results_continue_as_the_template_groups_them(name):
    tokenizer = build_family_test_tokenizer(name)
    builder = ChatPromptBuilder(tokenizer, SYSTEM)
    text = tokenizer.decode(
        builder.continuation_ids(
            [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
        )
    )
    assert text == (
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
