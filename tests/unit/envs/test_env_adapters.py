"""The gymnasium:, textarena: and reasoning_gym: adapters on the real libraries (no model)."""

from __future__ import annotations

import sys

import pytest

from roll_async.envs import make_env

pytest.importorskip("gymnasium")
pytest.importorskip("textarena")
pytest.importorskip("reasoning_gym")


def test_gymnasium_frozen_lake_passes_rewards_and_termination_through():
    env = make_env("gymnasium:FrozenLake-v1", {"is_slippery": False})
    observation, info = env.reset(seed=0)
    assert (
        observation.splitlines()[0] == "PFFF"
        and "Left, Down, Right, Up" in info["instruction"]
    )
    _, reward, terminated, _, step_info = env.step(
        "I think <answer>Up</answer> no wait"
    )
    assert (reward, terminated) == (0.0, False) and step_info["metrics"][
        "action_is_valid"
    ]
    _, reward, terminated, _, step_info = env.step("no tags here")
    assert (
        reward == -0.1
        and not terminated
        and step_info["metrics"]["invalid_actions"] == 1.0
    )
    for move in ["Down", "Down", "Right", "Right", "Down"]:
        assert env.step(f"<answer>{move}</answer>")[2] is False
    # case-insensitive
    observation, reward, terminated, truncated, step_info = env.step(
        "<answer>right</answer>"
    )
    assert (reward, terminated, truncated) == (1.0, True, False) and step_info[
        "metrics"
    ]["success"]
    assert observation.splitlines()[-1] == "HFFP"


def test_gymnasium_env_config_is_forwarded_to_make_and_taxi_blackjack_render_as_text():
    env = make_env("gymnasium:FrozenLake-v1", {"map_name": "8x8", "is_slippery": False})
    assert len(env.reset(seed=1)[0].splitlines()) == 8
    taxi = make_env("gymnasium:Taxi-v4", {})
    assert (
        "The taxi is at row" in taxi.reset(seed=1)[0]
        and taxi.step("<answer>Pickup</answer>")[1] == -10.0
    )
    blackjack = make_env("gymnasium:Blackjack-v1", {})
    assert blackjack.reset(seed=2)[0].startswith("Your hand totals")
    assert blackjack.step("<answer>Stick</answer>")[2] is True


def test_gymnasium_unknown_id_lists_close_matches():
    with pytest.raises(
        ValueError,
        match="unknown gymnasium id 'FrozenLake-v2'; close matches: FrozenLake-v1",
    ):
        make_env("gymnasium:FrozenLake-v2", {})


def test_textarena_guess_the_number_rewards_from_close_and_counts_invalid_moves():
    env = make_env("textarena:GuessTheNumber-v0", {})
    observation, info = env.reset(seed=3)
    assert "Guess The Number" in info["instruction"]
    low, high, invalid_seen = 1, 20, False
    for _ in range(10):
        guess = (low + high) // 2
        text, reward, terminated, _, step_info = env.step(f"My guess: [{guess}]")
        if "higher" in text:
            low = guess + 1
        elif "lower" in text:
            high = guess - 1
        if terminated:
            break
        # one invalid move (TextArena allows one, then ends the game)
        if not invalid_seen:
            text, _, terminated, _, step_info = env.step("[99]")
            assert (
                step_info["metrics"]["invalid_move"]
                and step_info["metrics"]["invalid_moves"] == 1.0
                and not terminated
            )
            invalid_seen = True
    assert terminated and reward == 1.0 and step_info["metrics"]["success"]


def test_textarena_unknown_multiplayer_and_networked_ids_are_clear_errors():
    with pytest.raises(ValueError, match="close matches: GuessTheNumber-v0"):
        make_env("textarena:GuessTheNumbr-v0", {})
    with pytest.raises(ValueError, match="not a single-player game"):
        make_env("textarena:TicTacToe-v0", {}).reset(seed=0)
    with pytest.raises(ValueError, match="allow_network"):
        make_env("textarena:Wordle-v0", {})


def test_reasoning_gym_grades_with_the_task_scorer_and_retries_a_wrong_answer():
    import reasoning_gym

    env = make_env("reasoning_gym:basic_arithmetic", {"max_attempts": 2})
    _, info = env.reset(seed=5)
    answer = reasoning_gym.create_dataset("basic_arithmetic", seed=5, size=1)[0][
        "answer"
    ]
    assert (
        reasoning_gym.create_dataset("basic_arithmetic", seed=5, size=1)[0]["question"]
        in info["instruction"]
    )
    text, reward, terminated, _, step_info = env.step("<answer>not a number</answer>")
    assert (
        (reward, terminated) == (0.0, False)
        and "Try again" in text
        and step_info["metrics"]["attempts"] == 1.0
    )
    _, reward, terminated, _, step_info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated) == (1.0, True) and step_info["metrics"]["success"]
    with pytest.raises(ValueError, match="close matches: basic_arithmetic"):
        make_env("reasoning_gym:basic_arithmetik", {})


@pytest.mark.parametrize(
    ("env_type", "module"),
    [
        ("gymnasium:FrozenLake-v1", "gymnasium"),
        ("textarena:GuessTheNumber-v0", "textarena"),
        ("reasoning_gym:chain_sum", "reasoning_gym"),
    ],
)
def test_a_missing_adapter_package_names_the_extra(monkeypatch, env_type, module):
    monkeypatch.setitem(
        sys.modules, module, None
    )  # import of it now raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'roll-async\[envs\]'"):
        make_env(env_type, {})
