"""The openenv: adapter on the real openenv-core: envs from tests/unit/envs/openenv_envs.py served on the loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

pytest.importorskip(
    "openenv"
)  # scripts/setup.sh installs it (the openenv extra); CI never skips

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.envs import make_env
from roll_async.envs.adapters.openenv_env import _make_client
from roll_async.envs.adapters.openenv_server import running_servers
from roll_async.errors import ConfigError, EnvLibraryError, LifecycleError
from roll_async.pipelines.preflight import check_env_in_process
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine

M = "tests.unit.envs.openenv_envs"
COUNT = {
    "action_type": f"{M}:CountAction",
    "observation_type": f"{M}:CountObservation",
    "observation_field": "total",
    "action_pattern": r"<answer>(.*?)</answer>",
    "instruction": "Reach the goal.",
    "env_kwargs": {"goal": 5},
}


def count_env(**overrides):
    return make_env(f"openenv:{M}:CountEnvironment", {**COUNT, **overrides})


def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def test_reset_step_map_text_reward_done_and_success_over_the_websocket_session():
    env = count_env()
    try:
        observation, info = env.reset(seed=2)
        assert (observation, info) == (
            "2",
            {"instruction": "Reach the goal.", "seed": 2},
        )
        text, reward, terminated, truncated, step_info = env.step(
            "I add <answer>1</answer>"
        )
        assert (text, reward, terminated, truncated) == ("3", 0.0, False, False)
        assert step_info["metrics"] == {
            "action_is_valid": True,
            "success": False,
            "invalid_actions": 0.0,
        }
        # the session holds the episode: the total carries over between steps
        text, reward, terminated, _, step_info = env.step("<answer>2</answer>")
        assert (text, reward, terminated) == ("5", 1.0, True)
        assert step_info["metrics"]["success"] is True
        with pytest.raises(LifecycleError, match="after the episode ended"):
            env.step("<answer>1</answer>")
        # a new episode on the same session
        assert env.reset(seed=0)[0] == "0"
    finally:
        env.close()


def test_a_reply_without_a_valid_action_costs_the_penalty_and_does_not_step():
    env = count_env()
    try:
        env.reset(seed=1)
        text, reward, terminated, _, info = env.step("no tags")
        assert reward == -0.1 and not terminated
        assert text == (
            "Invalid action: no match for <answer>(.*?)</answer> in the reply\n1"
        )
        text, reward, _, _, info = env.step("<answer>two</answer>")
        assert reward == -0.1
        assert text.startswith("Invalid action: CountAction rejected it (amount: ")
        assert info["metrics"]["invalid_actions"] == 2.0
        assert (
            env.step("<answer>1</answer>")[0] == "2"
        )  # the env never saw the bad ones
    finally:
        env.close()


def test_envs_of_one_class_share_one_loopback_server_sized_to_them_and_the_last_close_stops_it():
    assert running_servers() == 0
    envs = [count_env() for _ in range(3)]
    url = envs[0].url
    assert [e.url for e in envs] == [url] * 3 and url.startswith("http://127.0.0.1:")
    assert running_servers() == 1 and envs[0]._lease.max_concurrent_envs == 3
    for env in envs:
        env.reset(seed=0)
    # a fourth session is beyond the server's size: OpenEnv refuses it
    extra = _make_client(url, 5.0, 5.0).connect()
    refusal = json.loads(extra._ws.recv(timeout=5))  # sent as the session opens
    assert refusal["data"]["code"] == "CAPACITY_REACHED"
    assert refusal["data"]["max_sessions"] == 3
    extra.close()
    envs.pop().close()
    assert envs[0]._lease.max_concurrent_envs == 2 and not refused(url)
    for env in envs:
        env.close()
    assert running_servers() == 0
    assert refused(url)


def test_a_class_without_concurrent_sessions_gets_a_server_per_env():
    a = make_env(f"openenv:{M}:SoloCountEnvironment", COUNT)
    b = make_env(f"openenv:{M}:SoloCountEnvironment", COUNT)
    try:
        assert a.url != b.url
        assert a.reset(seed=3)[0] == "3" and b.reset(seed=4)[0] == "4"
    finally:
        a.close()
        b.close()
    assert refused(a.url) and refused(b.url)


@pytest.fixture
def running_server():
    """A server started the way an OpenEnv user starts one: create_app + uvicorn, on a free loopback port."""
    import uvicorn
    from openenv.core.env_server import create_app

    from tests.unit.envs.openenv_envs import (
        CountAction,
        CountEnvironment,
        CountObservation,
    )

    app = create_app(
        CountEnvironment, CountAction, CountObservation, max_concurrent_envs=2
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join()


def test_a_running_server_by_url_with_the_observation_as_json(running_server):
    env = make_env(
        f"openenv:{running_server}",
        {"action_type": f"{M}:CountAction", "action_field": "amount"},
    )
    try:
        observation, _ = env.reset(seed=9)
        assert observation == '{"note": "start", "total": 9}'
        text, reward, terminated, _, _ = env.step("3")
        assert (text, reward, terminated) == (
            '{"note": "goal", "total": 12}',
            1.0,
            True,
        )
    finally:
        env.close()
    with pytest.raises(ConfigError, match="env_kwargs builds a class"):
        make_env(f"openenv:{running_server}", COUNT)


def test_a_url_that_does_not_answer_fails_in_one_line_at_load_and_at_check():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}"
    config = {"action_type": f"{M}:CountAction"}
    with pytest.raises(ConfigError) as exc:
        make_env(f"openenv:{url}", config)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(
        f"env_type 'openenv:{url}': no OpenEnv server answers at {url}"
    )
    assert message.endswith("start the server there or fix the URL in the env_type")
    spec = CustomEnvConfig(env_type=f"openenv:{url}", env_config=config)
    with pytest.raises(ConfigError) as exc:
        check_env_in_process("Remote", spec, PipelineConfig())
    assert str(exc.value) == f"custom_envs.Remote: {message}"


def test_action_builders_and_action_fields_are_configurable_and_checked():
    text_env = {
        "action_type": f"{M}:TextAction",
        "observation_type": f"{M}:TextObservation",
    }
    env = make_env(
        f"openenv:{M}:FaultyEnvironment",
        {
            **text_env,
            "action_builder": f"{M}:loud_text",
            "env_kwargs": {"fail_every": 99},
        },
    )
    try:
        env.reset(seed=0)
        action, error = env.build_action('{"text": "hi", "loud": true}')
        assert (action.text, action.loud, error) == ("hi", True, "")
        assert env.build_action("hi")[1] == "the reply is not JSON (Expecting value)"
        assert (
            "loud: Input should be a valid boolean"
            in env.build_action('{"text": "hi", "loud": "maybe"}')[1]
        )
    finally:
        env.close()
    counting = count_env(action_builder=f"{M}:random_amount", action_pattern=None)
    try:
        counting.reset(seed=0)
        assert 1 <= int(counting.step("anything")[0]) <= 3
    finally:
        counting.close()
    # TextAction has one required field (text): the reply goes there unless action_field says otherwise
    env = make_env(f"openenv:{M}:FaultyEnvironment", text_env)
    assert env.action_field == "text"
    env.close()
    with pytest.raises(
        ConfigError,
        match="action_field 'words' is not a field of TextAction; its fields: loud, text",
    ):
        make_env(
            f"openenv:{M}:FaultyEnvironment", {**text_env, "action_field": "words"}
        )
    with pytest.raises(ConfigError, match="needs env_config.action_type"):
        make_env(f"openenv:{M}:CountEnvironment", {})
    with pytest.raises(ConfigError, match="needs env_config.observation_type"):
        make_env(f"openenv:{M}:CountEnvironment", {"action_type": f"{M}:CountAction"})
    bad = count_env(observation_field="score")
    try:
        with pytest.raises(
            ConfigError,
            match="observation_field 'score' is not in the observation; its fields: note, total",
        ):
            bad.reset(seed=0)
    finally:
        bad.close()


def test_a_server_error_mid_episode_is_an_env_library_error():
    env = make_env(
        f"openenv:{M}:FaultyEnvironment",
        {
            "action_type": f"{M}:TextAction",
            "observation_type": f"{M}:TextObservation",
            "env_kwargs": {"fail_every": 1},
        },
    )
    try:
        env.reset(seed=0)
        with pytest.raises(
            EnvLibraryError,
            match="step failed on the OpenEnv server at .*the env's backend fell over",
        ):
            env.step("hello")
    finally:
        env.close()


async def test_a_faulting_env_ends_its_episode_env_error_and_the_group_is_refilled():
    tokenizer = build_chatml_test_tokenizer()
    reply = tokenizer("hello", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=4,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Faulty": CustomEnvConfig(
                env_type=f"openenv:{M}:FaultyEnvironment",
                env_config={
                    "action_type": f"{M}:TextAction",
                    "observation_type": f"{M}:TextObservation",
                    "env_kwargs": {"fail_every": 3, "episode_length": 2},
                },
                max_steps=3,
                max_tokens_per_step=8,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2, group_size=2, tags=["Faulty"], env_step_timeout_s=5.0
        ),
    )
    validate_config(config)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(lambda r: reply),
        tokenizer=tokenizer,
    )
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 30
        )
    finally:
        await scheduler.shutdown()
    assert (
        running_servers() == 0
    )  # every env closed at shutdown: the worker's server stopped
    assert len(batch) == 4
    assert all(t.stop_reason == "terminated" for t in batch)
    assert all(
        t.episode_reward == 2.0 for t in batch
    )  # the server's reward, 1 per step
    assert metrics["rollout/env_errors"] >= 1
    assert (
        sum(m.stats.env_errors for m in scheduler.managers)
        == metrics["rollout/env_errors"]
    )
