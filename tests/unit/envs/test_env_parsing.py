"""The shared action parser: tags, custom patterns, separators, limits, and never raising on model output."""

from __future__ import annotations

import pytest

from roll_async.envs import ActionParser, make_env
from roll_async.envs.parsing import wrap_with_pattern

WORDS = ("Up", "Down", "Left", "Right")


def test_last_tag_wins_and_words_are_canonicalised():
    p = ActionParser(valid_actions=WORDS)
    got = p.parse("maybe <answer>Up</answer>... no: <answer> left </answer>")
    assert got.actions == ["Left"] and got.is_valid and got.error is None


@pytest.mark.parametrize(
    "text, error",
    [
        ("Up", "no action found"),
        ("<answer>  </answer>", "empty action"),
        ("<answer>Jump</answer>", "unknown action 'Jump'"),
        ("<answer>Up", "no action found"),
        (None, "no action found"),
    ],
)
def test_bad_responses_are_reported_not_raised(text, error):
    got = ActionParser(valid_actions=WORDS).parse(text)
    assert not got.is_valid and error in got.error


def test_separator_limit_and_valid_prefix():
    p = ActionParser(separator="||", max_actions=2, valid_actions=WORDS)
    got = p.parse("<answer>Up || Down || Left</answer>")
    assert got.actions == ["Up", "Down"] and got.num_dropped == 1 and got.is_valid
    got = p.parse("<answer>Up || Fly</answer>")
    assert got.actions == ["Up"] and not got.is_valid


def test_free_form_actions_keep_separators():
    got = ActionParser(separator="", valid_actions=None).parse(
        "<answer>Paris, France</answer>"
    )
    assert got.actions == ["Paris, France"] and got.is_valid


def test_custom_pattern_through_env_config():
    env = make_env(
        "sokoban",
        {
            "action_pattern": r"\[\[(.*?)\]\]",
            "action_separator": ";",
            "max_actions_per_turn": 2,
        },
    )
    _, info = env.reset(0)
    assert "[[Up]]" in info["instruction"] and "[[Up; Left]]" in info["instruction"]
    *_, info = env.step("[[Up; Down]]")
    assert info["actions"] == ["Up", "Down"]
    assert env.expert_responses()[0].startswith("[[")


def test_wrap_inverts_parse():
    for pattern in [r"<answer>(.*?)</answer>", r"\[\[(.*?)\]\]", r"ACTION: (\w+)"]:
        p = ActionParser(pattern=pattern, valid_actions=WORDS)
        assert p.parse(p.wrap("Right")).actions == ["Right"], pattern
    assert wrap_with_pattern(r"<search>(.*?)</search>", "q") == "<search>q</search>"


@pytest.mark.parametrize(
    "pattern, message",
    [("<answer>.*</answer>", "capture group"), ("<answer>(", "not a valid regex")],
)
def test_bad_patterns_fail_at_construction(pattern, message):
    with pytest.raises(ValueError, match=message):
        make_env("frozen_lake", {"action_pattern": pattern})
