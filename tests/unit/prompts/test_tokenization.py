"""ChatPromptBuilder: incremental ids agree with the chat template, and bad templates are refused."""

from __future__ import annotations

import pytest

from roll_async.errors import ChatTemplateError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer


@pytest.fixture(scope="module")
def chatml():
    return build_chatml_test_tokenizer()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    return encode(
        tokenizer,
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        ),
    )


def test_first_turn_is_the_template_with_a_generation_prompt(chatml):
    builder = ChatPromptBuilder(chatml, "Be brief.")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go left."},
    ]
    assert builder.first_turn_ids("Go left.") == render_ids(chatml, messages, True)
    assert chatml.decode(builder.first_turn_ids("Go left.")).endswith(
        "<|im_start|>assistant\n"
    )


def test_incremental_ids_equal_the_template_of_the_whole_conversation(chatml):
    """With canonically tokenized replies, prompt + reply + closure + delta is exactly the full template."""
    builder = ChatPromptBuilder(chatml, "Be brief.")
    replies = ["<answer>Up</answer>", "<answer>Left</answer>"]
    users = ["grid 1", "grid 2", "grid 3"]
    ids = builder.first_turn_ids(users[0])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": users[0]},
    ]
    for reply, user in zip(replies, users[1:]):
        # the model ends its turn with EOS
        generated = encode(chatml, reply) + [chatml.eos_token_id]
        ids = (
            ids
            + generated
            + builder.closure_ids_after(generated)
            + builder.user_delta_ids(user)
        )
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": user},
        ]
    assert ids == render_ids(chatml, messages, True)


def test_turn_closure_depends_on_whether_the_model_emitted_eos(chatml):
    builder = ChatPromptBuilder(chatml)
    with_eos = encode(chatml, "<answer>Up</answer>") + [chatml.eos_token_id]
    without_eos = encode(chatml, "<answer>Up</answer>")
    assert builder.closure_ids_after(with_eos) == encode(chatml, "\n")
    assert builder.closure_ids_after(without_eos) == encode(chatml, "<|im_end|>\n")
    assert builder.closure_ids_after([]) == encode(chatml, "<|im_end|>\n")


def test_decode_drops_special_tokens(chatml):
    builder = ChatPromptBuilder(chatml)
    assert (
        builder.decode(encode(chatml, "<answer>Up</answer>") + [chatml.eos_token_id])
        == "<answer>Up</answer>"
    )


def test_a_template_that_rewrites_earlier_text_still_gives_the_rendered_delta(chatml):
    import copy

    tokenizer = copy.deepcopy(chatml)
    # Puts the number of messages first, so adding a message changes earlier text: the delta is still
    # what the template renders for the new turn, found by locating the sentinel reply.
    tokenizer.chat_template = (
        "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    builder = ChatPromptBuilder(tokenizer)
    assert builder.user_delta_ids("next") == encode(
        tokenizer, "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not builder.describe().append_only


def test_a_template_that_drops_assistant_content_is_refused(chatml):
    import copy

    tokenizer = copy.deepcopy(chatml)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(
        ChatTemplateError, match="drops assistant content.*model.chat_template"
    ):
        ChatPromptBuilder(tokenizer)


def test_user_delta_is_the_continuation_of_one_user_message(chatml):
    builder = ChatPromptBuilder(chatml, "sys")
    assert builder.user_delta_ids("grid 2") == builder.continuation_ids(
        [{"role": "user", "content": "grid 2"}]
    )
    assert builder.render_ids([{"role": "user", "content": "u"}], True) == encode(
        chatml, "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_tokenizer_without_chat_template_is_refused(chatml):
    import copy

    tokenizer = copy.deepcopy(chatml)
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        ChatPromptBuilder(tokenizer)


def test_works_with_the_project_tiny_model_tokenizer(tokenizer):
    """The lead's offline tiny model (session fixture in tests/conftest.py) uses the same ChatML shape."""
    builder = ChatPromptBuilder(tokenizer, "sys")
    generated = encode(tokenizer, "<answer>Up</answer>") + [tokenizer.eos_token_id]
    ids = (
        builder.first_turn_ids("u1")
        + generated
        + builder.closure_ids_after(generated)
        + builder.user_delta_ids("u2")
    )
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "u2"},
    ]
    assert ids == render_ids(tokenizer, messages, True)


def test_load_tokenizer_fast_path_matches_auto_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    from roll_async.prompts.tokenizers import load_tokenizer

    fast = load_tokenizer(str(tiny_model_path))
    auto = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "Grid:\n#_P# <answer>Up</answer> √"},
    ]
    assert fast.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = "Reply <answer>Left</answer><|im_end|>\n ünïcode"
    ids = auto(text, add_special_tokens=False)["input_ids"]
    assert fast(text, add_special_tokens=False)["input_ids"] == ids
    assert fast.decode(ids, skip_special_tokens=True) == auto.decode(
        ids, skip_special_tokens=True
    )
    assert (fast.eos_token_id, fast.pad_token_id) == (
        auto.eos_token_id,
        auto.pad_token_id,
    )


#: ChatML that prepends the system text to the LAST user message, wherever it stands (a reply may follow).
SYSTEM_ON_LAST_USER = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages %}{% if m['role'] == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}"
    "{%- for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
    "{% if loop.index0 == ns.last and system %}{{ system }}\n\n{% endif %}{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_system_prompt_on_the_last_user_message_is_said_once(chatml):
    """Over a 3-turn trajectory the system text appears once in the ids, and each turn's prompt only appends."""
    system = "Answer in one word."
    builder = ChatPromptBuilder(chatml, system, chat_template=SYSTEM_ON_LAST_USER)
    users = ["grid 1", "grid 2", "grid 3"]
    first = builder.first_turn_ids(users[0])
    assert chatml.decode(first) == (
        f"<|im_start|>user\n{system}\n\ngrid 1<|im_end|>\n<|im_start|>assistant\n"
    )
    prompts = [first]
    ids = list(first)
    for user in users[1:]:
        generated = encode(chatml, "<answer>Up</answer>") + [chatml.eos_token_id]
        delta = builder.user_delta_ids(user)
        assert system not in chatml.decode(delta)
        assert chatml.decode(delta) == (
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        )
        ids = ids + generated + builder.closure_ids_after(generated) + delta
        prompts.append(list(ids))
    for shorter, longer in zip(prompts, prompts[1:]):
        assert longer[: len(shorter)] == shorter
    assert chatml.decode(ids).count(system) == 1
    assert ids == builder.incremental_ids(
        users, [encode(chatml, "<answer>Up</answer>") + [chatml.eos_token_id]] * 2
    )
    tool_turn = builder.continuation_text([{"role": "tool", "content": "found it"}])
    assert system not in tool_turn and "found it" in tool_turn
