"""Behaviour every built-in env shares: determinism, seeds, expert success, penalties, metrics, episode bounds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from roll_async.envs import Observation, make_env

# Small, fast configs; the expert must reach success within max_steps.
BUILTINS = {
    "sokoban": {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 40},
    "frozen_lake": {"size": 4, "max_steps": 30},
    "sliding_puzzle": {"size": 3, "num_scramble": 8, "max_steps": 30},
    "countdown": {},
    "retrieval_qa": {},
}
#: A well-tagged but invalid response per env (an unknown word, a non-expression, an empty query).
INVALID = {name: "I would go <answer>Jump</answer>" for name in BUILTINS} | {
    "retrieval_qa": "I search <search> </search>"
}
SEEDS = range(8)


def text(obs) -> str:
    return obs if isinstance(obs, str) else obs.text


def rollout(env, seed: int, responses: list[str]) -> list[tuple]:
    obs, info = env.reset(seed)
    out = [(text(obs), info["instruction"])]
    for r in responses:
        if env.done:
            break
        obs, reward, term, trunc, info = env.step(r)
        out.append((text(obs), reward, term, trunc, info["metrics"]))
    return out


@pytest.fixture(params=sorted(BUILTINS))
def name(request) -> str:
    return request.param


def test_same_seed_same_episode(name):
    env = make_env(name, BUILTINS[name])
    env.reset(3)
    responses = (env.expert_responses() or [])[:3] + [INVALID[name]]
    other = make_env(name, BUILTINS[name])
    other.reset(99)  # a used env object must not carry state into the next episode
    assert rollout(env, 3, responses) == rollout(other, 3, responses)


def test_different_seeds_differ(name):
    env = make_env(name, BUILTINS[name])
    starts = {text(env.reset(seed)[0]) for seed in range(10)}
    assert len(starts) >= 6, starts


def test_expert_reaches_success(name):
    env = make_env(name, BUILTINS[name])
    for seed in SEEDS:
        env.reset(seed)
        responses = env.expert_responses()
        assert responses, f"{name} seed {seed}: no expert plan"
        total = 0.0
        for r in responses:
            _, reward, term, trunc, info = env.step(r)
            total += reward
            assert info["metrics"]["action_is_valid"] is True
        assert term and not trunc and info["metrics"]["success"] is True, (name, seed)
        assert total > 0


def test_invalid_action_is_penalised_and_reported(name):
    env = make_env(name, {**BUILTINS[name], "format_penalty": -0.25})
    obs0, _ = env.reset(1)
    for bad in (INVALID[name], "no tags at all", ""):
        obs, reward, term, _, info = env.step(bad)
        m = info["metrics"]
        assert reward == pytest.approx(-0.25)
        assert (
            m["action_is_valid"] is False
            and m["action_is_effective"] is False
            and m["success"] is False
        )
        assert info["format_error"]
        assert text(obs).startswith("Invalid action:")
        # state unchanged, shown again after the feedback
        assert text(obs).endswith(text(obs0))
        assert not term


def test_metrics_have_the_documented_types(name):
    env = make_env(name, BUILTINS[name])
    env.reset(0)
    _, _, _, _, info = env.step((env.expert_responses() or ["x"])[0])
    for key in ("action_is_valid", "action_is_effective", "success"):
        assert isinstance(info["metrics"][key], bool), key
    assert all(isinstance(v, (bool, float)) for v in info["metrics"].values()), info[
        "metrics"
    ]


def test_truncates_at_max_steps_and_then_refuses_steps(name):
    env = make_env(name, {**BUILTINS[name], "max_steps": 2})
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(INVALID[name])
    env.reset(0)
    assert env.step(INVALID[name])[3] is False
    _, _, term, trunc, _ = env.step(INVALID[name])
    assert (term, trunc) == (False, True)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(INVALID[name])


def test_reset_gives_instruction_with_answer_format(name):
    env = make_env(name, BUILTINS[name])
    obs, info = env.reset(0)
    assert isinstance(obs, str) and obs
    assert "<answer>" in info["instruction"] and "</answer>" in info["instruction"]


def test_envs_run_concurrently_in_threads(name):
    """EnvManagers call sync envs from a thread pool; instances must not share state."""

    def episode(seed: int) -> list[tuple]:
        env = make_env(name, BUILTINS[name])
        env.reset(seed)
        return rollout(env, seed, env.expert_responses() or [])

    expected = [episode(s) for s in range(6)]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(episode, range(6))) == expected


@pytest.mark.parametrize("grid", ["sokoban", "frozen_lake"])
def test_vision_render_mode(grid):
    env = make_env(
        grid, {**BUILTINS[grid], "render_mode": "vision", "image_cell_size": 10}
    )
    obs, info = env.reset(2)
    assert isinstance(obs, Observation)
    assert obs.text.count("<image>") == len(obs.images) == 1
    size = (6, 6) if grid == "sokoban" else (4, 4)
    assert (
        obs.images[0].size == (size[1] * 10, size[0] * 10)
        and obs.images[0].mode == "RGB"
    )
    assert "image" in info["instruction"]
    step_obs = env.step(env.expert_responses()[0])[0]
    assert isinstance(step_obs, Observation)
    # the picture follows the state
    assert step_obs.images[0].tobytes() != obs.images[0].tobytes()


@pytest.mark.parametrize("name", ["sliding_puzzle", "countdown", "retrieval_qa"])
def test_vision_is_refused_where_unsupported(name):
    with pytest.raises(ValueError, match="render_mode"):
        make_env(name, {"render_mode": "vision"})
