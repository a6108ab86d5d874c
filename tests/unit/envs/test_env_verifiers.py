"""``env_type: verifiers:<env id>`` with the installed verifiers (classic API, < 0.4) against a FAKE engine.

The test envs are roll_async/testing/verifiers_envs.py (a SingleTurnEnv and a two-turn MultiTurnEnv with a
two-function Rubric). Each episode runs through the real agent gateway and openai client: the checks are the
row a seed picks, the rubric's reward and per-function metrics, token-exact history over two turns, the
env_error of an env that raises mid-episode, the one-line load errors, and roll-async's SIGINT/SIGTERM
handlers surviving an env's construction on the main thread and off it. The verifiers 0.4 (``verifiers.v1``)
path is tested in test_env_verifiers_v1.py.
"""

from __future__ import annotations

import signal
import threading

import pytest

from roll_async.config.schema import CustomEnvConfig
from roll_async.envs.adapters import verifiers_env
from roll_async.envs.adapters.verifiers_env import load_verifiers_env, row_for_seed
from roll_async.errors import ConfigError
from roll_async.pipelines.preflight import check_envs, import_user_code
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from tests.unit.envs.verifiers_play import play, replying
from tests.unit.envs.verifiers_play import verifiers_config as vf_config

pytest.importorskip("openai")
vf = pytest.importorskip(
    "verifiers",
    reason="verifiers is not installed (pip install 'roll-async[verifiers]')",
)
if verifiers_env.verifiers_api("test") != "legacy":
    pytest.skip("the installed verifiers is >= 0.4 (v1 API)", allow_module_level=True)

ENV_TYPE = "verifiers:roll_async.testing.verifiers_envs"


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def verifiers_config(env_config: dict | None = None):
    return vf_config(ENV_TYPE, env_config)


def test_a_verifiers_tag_is_an_agent_session_played_by_the_built_in_agent():
    spec = verifiers_config().custom_envs["Vf"]
    assert spec.agent is None
    assert (
        spec.agent_function
        == "roll_async.agent_gateway.verifiers_agent:verifiers_agent"
    )
    assert CustomEnvConfig(env_type="sokoban").agent_function is None


def test_the_seed_picks_the_row_and_rows_come_from_the_dataset():
    env = load_verifiers_env(ENV_TYPE, {"num_rows": 5}, "k")
    assert env.api == "legacy" and env.num_rows == 5
    assert [row_for_seed(s, 5) for s in (0, 4, 5, 12)] == [0, 4, 0, 2]
    assert (
        load_verifiers_env(ENV_TYPE, {"num_rows": 5}, "k") is env
    )  # loaded once per process


async def test_the_rubric_reward_is_the_episode_reward_and_its_functions_are_metrics(
    tokenizer,
):
    # seed 7 over 3 rows -> row 1, "What is 1 + 1?": the right answer scores 1 (correct) + 0.5 (replied)
    engine = replying(tokenizer, "2")
    trajectory, _ = await play(verifiers_config(), engine, tokenizer, seed=7)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 1.5
    assert trajectory.metrics["rubric_correct"] == 1.0
    assert trajectory.metrics["rubric_replied"] == 1.0
    assert trajectory.metrics["verifiers_row"] == 1.0
    assert "What is 1 + 1?" in tokenizer.decode(engine.prompts[0])
    wrong = replying(tokenizer, "5")
    trajectory, _ = await play(verifiers_config(), wrong, tokenizer, seed=7)
    assert (
        trajectory.episode_reward == 0.5 and trajectory.metrics["rubric_correct"] == 0.0
    )


async def test_a_multi_turn_env_s_history_is_token_exact_through_the_gateway(tokenizer):
    engine = replying(
        tokenizer, "3", "4"
    )  # seed 2 -> row 2, answer 4: the second reply is right
    trajectory, _ = await play(
        verifiers_config({"kind": "multi"}), engine, tokenizer, seed=2
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["agent_calls"] == 2.0
    assert trajectory.metrics["agent_segment_breaks"] == 0.0
    p0, p1 = engine.prompts
    first = tokenizer.encode("3", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert p1[: len(p0) + len(first)] == p0 + first  # the reply is never re-rendered
    assert "Are you sure?" in tokenizer.decode(p1[len(p0) + len(first) :])
    assert (
        trajectory.metrics["rubric_correct"] == 1.0 and trajectory.episode_reward == 1.5
    )


async def test_an_env_that_raises_mid_episode_is_an_env_error(tokenizer):
    engine = replying(tokenizer, "3", "4")
    trajectory, manager = await play(
        verifiers_config({"kind": "raising"}), engine, tokenizer, seed=0
    )
    assert trajectory.stop_reason == "env_error"
    assert "the env turn failed" in (trajectory.error or "")
    assert manager.stats.env_errors == 1


def test_an_env_that_cannot_load_fails_at_load_and_check_in_one_line():
    for env_type, env_config, needle in (
        (ENV_TYPE, {"kind": "broken"}, "cannot load"),
        ("verifiers:no_such_verifiers_env", {}, "no_such_verifiers_env"),
    ):
        config = verifiers_config(env_config)
        config.custom_envs["Vf"].env_type = env_type
        for check in (import_user_code, check_envs):
            with pytest.raises(ConfigError) as info:
                check(config)
            message = str(info.value)
            assert "\n" not in message and needle in message
            assert "custom_envs.Vf.env_type" in message
            assert "pip install 'roll-async[verifiers]'" in message


def test_a_missing_verifiers_is_one_line_naming_the_extra(monkeypatch):
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(ConfigError) as info:
        check_envs(verifiers_config({"num_rows": 2}))
    message = str(info.value)
    assert "\n" not in message and "custom_envs.Vf.env_type" in message
    assert "pip install 'roll-async[verifiers]'" in message


def test_construction_keeps_roll_async_s_interrupt_handlers_on_and_off_the_main_thread():
    def ours(signum, frame):  # stands in for roll_async.pipelines.interrupt's handler
        raise AssertionError("not called")

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in saved:
            signal.signal(s, ours)
        # a bare construction really replaces them (what the guard undoes)
        vf.SingleTurnEnv(
            dataset=None, eval_dataset=_one_row_dataset(), rubric=vf.Rubric()
        )
        assert signal.getsignal(signal.SIGINT) is not ours
        for s in saved:
            signal.signal(s, ours)
        load_verifiers_env(ENV_TYPE, {"num_rows": 4}, "main")
        assert all(signal.getsignal(s) is ours for s in saved)
        errors: list[BaseException] = []

        def build() -> None:
            try:
                load_verifiers_env(ENV_TYPE, {"num_rows": 6, "kind": "multi"}, "thread")
            except BaseException as exc:  # noqa: BLE001 - reported to the main thread
                errors.append(exc)

        worker = threading.Thread(target=build)
        worker.start()
        worker.join()
        assert errors == []
        assert all(signal.getsignal(s) is ours for s in saved)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _one_row_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"question": "q", "answer": "a"}])
