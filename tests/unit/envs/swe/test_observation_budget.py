"""A command's output cut to the observation budget: head and tail kept, the cut counted in the marker."""

from __future__ import annotations

import re

from roll_async.envs.swe.observation_budget import cut_to_budget
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer

TOKEN_CUT = re.compile(r"\n\.\.\. \[(\d+) tokens of output cut\] \.\.\.\n")
BYTE_CUT = re.compile(r"\n\.\.\. \[(\d+) bytes of output cut to the budget\] \.\.\.\n")


def test_a_long_output_keeps_its_head_and_tail_within_the_token_budget() -> None:
    tokenizer = build_chatml_test_tokenizer()
    text = "START " + " ".join(str(i) for i in range(3000)) + " END"
    ids = tokenizer.encode(text, add_special_tokens=False)
    cut, was_cut = cut_to_budget(text, 61, tokenizer)
    head, counted, tail = TOKEN_CUT.split(cut)
    assert was_cut and int(counted) == len(ids) - 61
    assert head == tokenizer.decode(ids[:31]) and text.startswith(head)
    assert tail == tokenizer.decode(ids[-30:]) and text.endswith(tail)
    assert head.startswith("START") and tail.endswith("2999 END")


def test_an_output_within_the_budget_is_left_alone() -> None:
    tokenizer = build_chatml_test_tokenizer()
    text = "a short output\nwith two lines"
    assert cut_to_budget(text, 1000, tokenizer) == (text, False)
    assert cut_to_budget(text, 1000, None) == (text, False)


def test_without_a_tokenizer_bytes_stand_in_for_tokens_and_no_character_is_split() -> (
    None
):
    text = "é" * 100 + "middle" * 50 + "ü" * 100  # two bytes per accented letter
    cut, was_cut = cut_to_budget(text, 41, None)
    head, counted, tail = BYTE_CUT.split(cut)
    assert was_cut and int(counted) == len(text.encode()) - 41
    # 21 head bytes hold 10 whole letters (the split one dropped), 20 tail bytes hold 10
    assert head == "é" * 10 and tail == "ü" * 10
