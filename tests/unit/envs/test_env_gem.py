"""The gem: adapter on the real gem-llm: its offline games, instruction and suffix, success, and its errors."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

pytest.importorskip("gem")  # scripts/setup.sh installs gem-llm; CI never skips

import tests.unit.envs.gem_envs  # noqa: F401  (registers the test envs with GEM)
from roll_async.config.schema import CustomEnvConfig, PipelineConfig
from roll_async.envs import make_env
from roll_async.errors import ConfigError, EnvLibraryError, LifecycleError
from roll_async.pipelines.preflight import check_env_in_process

GUESS = "gem:game:GuessTheNumber-v0-easy"


def play_guess_the_number(env):
    """Binary search through the adapter; returns the steps' (text, reward, terminated, truncated, info)."""
    low, high, steps = 1, 10, []
    while True:
        guess = (low + high) // 2
        step = env.step(f"I guess \\boxed{{{guess}}}")
        steps.append(step)
        text, _, terminated, truncated, _ = step
        if terminated or truncated:
            return steps
        if "higher" in text:
            low = guess + 1
        else:
            high = guess - 1


def test_the_instruction_is_gems_first_observation_and_the_suffix_ends_each_observation():
    env = make_env(GUESS, {})
    observation, info = env.reset(seed=4)
    instruction = info["instruction"]
    assert instruction.startswith(
        "You are playing Guess The Number.\n"
    )  # no empty first line
    assert "between 1 and 10 (inclusive) within 4 turns" in instruction
    assert (
        observation == "Enter your next guess."
    )  # GEM's suffix, as its observation wrapper adds it
    steps = play_guess_the_number(env)
    for text, reward, terminated, _, step_info in steps[:-1]:
        assert re.fullmatch(
            r"At turn \d, you guessed \d+, and the target number is (higher|lower) than \d+\.\nEnter your next guess\.",
            text,
        )
        assert (reward, terminated, step_info["metrics"]["success"]) == (
            0.0,
            False,
            False,
        )
    text, reward, terminated, truncated, step_info = steps[-1]
    assert text.startswith("Congratulations!") and not text.endswith("guess.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert step_info["metrics"]["success"] is True
    with pytest.raises(LifecycleError, match="after the episode ended"):
        env.step("\\boxed{1}")
    env.close()


def test_gems_rewards_format_errors_and_truncation_pass_through():
    env = make_env(GUESS, {"max_turns": 2})  # env_config goes to gem.make
    env.reset(seed=4)
    assert "within 2 turns" in env.env.unwrapped._get_instructions()
    text, reward, terminated, truncated, info = env.step("no number")
    assert (reward, terminated) == (-0.1, True)  # GEM ends the game on a format error
    assert text == "At turn 1, you did not provide a valid guess."
    assert info["metrics"]["success"] is False
    env.reset(seed=4)
    target = env.env.game_number
    wrong = 1 if target != 1 else 2
    env.step(f"\\boxed{{{wrong}}}")
    text, reward, terminated, truncated, info = env.step(
        f"\\boxed{{{wrong + 8 if wrong + 8 != target else wrong + 7}}}"
    )
    assert (terminated, truncated) == (True, True) and 0.0 < reward < 1.0
    assert text == "You have reached the maximum number of turns."
    assert info["metrics"]["success"] is False
    env.close()


def test_success_follows_gems_correct_flag_where_the_env_reports_it():
    env = make_env("gem:test:OneQuestion-v0", {})
    assert env.reset(seed=0) == (
        "",
        {"instruction": "What is 2 + 2? Answer in \\boxed{}.", "seed": 0},
    )
    text, reward, terminated, _, info = env.step("\\boxed{4}")
    assert (text, reward, terminated, info["metrics"]["success"]) == (
        "",
        0.5,
        True,
        True,
    )
    env.reset(seed=0)
    assert env.step("\\boxed{5}")[4]["metrics"]["success"] is False
    env.close()


def test_several_offline_games_play_a_turn():
    for env_id in (
        "game:Mastermind-v0-easy",
        "game:Minesweeper-v0-easy",
        "game:TowerofHanoi-v0-easy",
        "game:Sokoban-v0-easy",
    ):
        env = make_env(f"gem:{env_id}", {})
        observation, info = env.reset(seed=1)
        assert info["instruction"].startswith("You are ")
        assert (
            observation == env.env.get_task_suffix() or observation == ""
        )  # GEM's reset info has it or not
        text, reward, terminated, truncated, step_info = env.step("\\boxed{1}")
        assert isinstance(text, str) and isinstance(reward, float)
        assert "success" in step_info["metrics"]
        env.close()


def test_an_unknown_id_fails_in_one_line_with_close_matches():
    with pytest.raises(ConfigError) as exc:
        make_env("gem:game:GuessTheNumber-v9", {})
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(
        "env_type 'gem:game:GuessTheNumber-v9': unknown GEM id 'game:GuessTheNumber-v9'; close matches: "
    )
    assert "game:GuessTheNumber-v0-easy" in message


def test_a_failing_reset_at_check_names_the_tag_and_the_env_in_one_line():
    spec = CustomEnvConfig(env_type="gem:test:NeedsData-v0")
    with pytest.raises(ConfigError) as exc:
        check_env_in_process("Words", spec, PipelineConfig())
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(
        "custom_envs.Words: env_type 'gem:test:NeedsData-v0': reset(seed=42) raised LookupError: "
        "Resource 'words' not found. Please use the NLTK Downloader.; if the env needs data"
    )
    env = make_env("gem:test:NeedsData-v0", {})
    with pytest.raises(EnvLibraryError):  # in a rollout: the episode ends env_error
        env.reset(seed=0)


def test_importing_gem_leaves_this_processs_logging_alone():
    """gem's __init__ calls logging.basicConfig(level=INFO); the adapter undoes it (a fresh process: gem not yet imported)."""
    code = (
        "import logging; from roll_async.envs import make_env; "
        "make_env('gem:game:GuessTheNumber-v0-easy', {}); "
        "root = logging.getLogger(); print(len(root.handlers), root.level)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["0", str(logging.WARNING)]
