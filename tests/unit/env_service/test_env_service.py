"""Env server, RemoteEnv client and ProcessEnv isolation: real processes, a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing.forkserver
import time

import aiohttp
import psutil
import pytest
from aiohttp import web

from roll_async.config.schema import load_config
from roll_async.env_service.client import EnvServiceClient, RemoteEnv
from roll_async.env_service.process_env import EnvProcessError, ProcessEnv
from roll_async.env_service.server import EnvServer
from roll_async.envs import make_env
from roll_async.errors import ConfigError, EnvServiceError, EnvServiceUnavailable
from roll_async.pipelines.preflight import check_envs

HANG = {"inner_env_type": "countdown", "fault": "hang", "fault_probability": 1.0}


def env_processes() -> list[psutil.Process]:
    """Live env processes: the children of this process's multiprocessing forkserver.

    Only the forkserver's children count: a session's Ray and vLLM processes (started by
    integration tests earlier in the same pytest run) are children of ours too.
    """
    forkserver_pid = multiprocessing.forkserver._forkserver._forkserver_pid
    if forkserver_pid is None:
        return []
    try:
        children = psutil.Process(forkserver_pid).children()
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
async def server_url():
    server = EnvServer(isolation="process", env_timeout_s=30.0, max_envs=64)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_process_env_hang_is_killed_and_a_crash_is_reported():
    hung = ProcessEnv(functools.partial(make_env, "faulty", HANG))
    await hung.reset(1)
    pid = hung.pid
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(hung.step("<answer>1</answer>"), 0.5)
    assert (
        not psutil.pid_exists(pid)
        or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    )
    with pytest.raises(EnvProcessError, match="gone"):
        await hung.step("x")

    crashing = ProcessEnv(
        functools.partial(make_env, "faulty", {**HANG, "fault": "segfault"})
    )
    await crashing.reset(1)
    with pytest.raises(EnvProcessError, match="SIGSEGV") as info:
        await crashing.step("x")
    assert info.value.crashed


@pytest.mark.slow
async def test_process_counts_stay_bounded_over_many_episodes():
    """Every episode a fresh env process; hung ones killed; at most one per proxy alive, none left after."""
    most = 0
    for episode in range(16):
        env = ProcessEnv(
            functools.partial(make_env, "faulty", {**HANG, "fault_probability": 0.5})
        )
        await env.reset(episode)
        try:
            await asyncio.wait_for(env.step("<answer>1 + 2</answer>"), 1.0)
        except (TimeoutError, EnvProcessError):
            pass
        most = max(most, len(env_processes()))
        await env.close()
    assert most <= 1
    deadline = time.monotonic() + 10
    while env_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert env_processes() == []


async def test_remote_env_plays_an_episode(server_url):
    env = RemoteEnv(server_url, "countdown", {}, call_timeout_s=30)
    observation, info = await env.reset(3)
    assert "Target" in observation and "instruction" in info
    expert = make_env("countdown", {})
    expert.reset(3)
    observation, reward, terminated, truncated, info = await env.step(
        expert.expert_responses()[0]
    )
    assert (reward, terminated) == (1.0, True) and info["metrics"]["success"] is True
    await env.close()
    async with aiohttp.ClientSession() as session:
        health = await (await session.get(server_url + "/health")).json()
    assert health["status"] == "ok" and health["envs"] == 0


async def test_a_hung_env_on_the_server_is_killed_and_the_server_goes_on(server_url):
    env = RemoteEnv(server_url, "faulty", HANG, call_timeout_s=1.0)
    await env.reset(1)
    with pytest.raises(EnvServiceError, match="exceeded timeout_s") as info:
        await env.step("x")
    assert info.value.kind == "timeout" and env.env_id is None
    fresh = RemoteEnv(server_url, "countdown", {}, call_timeout_s=30)
    await fresh.reset(1)
    await fresh.close()
    async with aiohttp.ClientSession() as session:
        health = await (await session.get(server_url + "/health")).json()
    assert health["stats"]["timeouts"] >= 1 and health["envs"] == 0


@pytest.mark.parametrize(
    "method, path, body, status, reason",
    [
        ("POST", "/v1/envs", "not json", 400, "not valid JSON"),
        ("POST", "/v1/envs", {"env_config": {}}, 400, "missing field 'env_type'"),
        ("POST", "/v1/envs", {"env_type": 3}, 400, "'env_type' must be str"),
        (
            "POST",
            "/v1/envs",
            {"env_type": "countdown", "env_config": [1]},
            400,
            "'env_config' must be an object",
        ),
        ("POST", "/v1/envs", {"env_type": "no_such_env"}, 404, "unknown env_type"),
        (
            "POST",
            "/v1/envs",
            {"env_type": "countdown", "timeout_s": -1},
            400,
            "timeout_s",
        ),
        (
            "POST",
            "/v1/envs/e999/step",
            {"action": "x", "seq": 1},
            404,
            "no env with id 'e999' on this server",
        ),
        ("POST", "/v1/envs/e999/reset", {"seed": "one"}, 400, "'seed' must be int"),
        ("POST", "/v1/batch", {"calls": 5}, 400, "'calls' must be list"),
    ],
)
async def test_malformed_requests_get_a_4xx_with_the_reason(
    server_url, method, path, body, status, reason
):
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": body} if isinstance(body, str) else {"json": body}
        response = await session.request(method, server_url + path, **kwargs)
        payload = await response.json()
        assert response.status == status and reason in payload["error"]
        assert (await session.get(server_url + "/health")).status == 200


async def test_batch_endpoint_runs_many_calls_in_one_round_trip(server_url):
    calls = [{"op": "create", "env_type": "countdown", "seed": s} for s in range(3)] + [
        {"op": "bogus"}
    ]
    async with aiohttp.ClientSession() as session:
        results = (
            await (
                await session.post(server_url + "/v1/batch", json={"calls": calls})
            ).json()
        )["results"]
        assert [r["status"] for r in results] == [200, 200, 200, 400]
        ids = [r["body"]["env_id"] for r in results[:3]]
        closes = [{"op": "close", "env_id": i} for i in ids]
        results = (
            await (
                await session.post(server_url + "/v1/batch", json={"calls": closes})
            ).json()
        )["results"]
        assert all(r["ok"] for r in results)


async def test_unreachable_servers_are_retried_then_reported_naming_the_url(server_url):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    alone = RemoteEnv(dead, "countdown", {}, call_timeout_s=5, max_retries=1)
    with pytest.raises(EnvServiceUnavailable, match="127.0.0.1:9"):
        await alone.reset(1)
    client = EnvServiceClient([dead, server_url], max_retries=1, retry_backoff_s=0.01)
    client.envs_on[server_url] = (
        5  # the live one looks busier, so the dead one is tried first
    )
    with pytest.raises(EnvServiceError, match="other servers of the tag"):
        await client.request(client.pick_url(), "GET", "/health", timeout_s=5)
    assert client.pick_url() == server_url  # the dead URL is avoided for a while


def test_preflight_names_an_unreachable_service_url():
    config = load_config(
        "configs/countdown.yaml",
        ["custom_envs.Countdown.service_url=http://127.0.0.1:9"],
    )
    with pytest.raises(
        ConfigError, match=r"custom_envs.Countdown.service_url: .*http://127.0.0.1:9"
    ):
        check_envs(config)


@pytest.mark.parametrize(
    "override, message",
    [
        ("custom_envs.Countdown.isolation=thread", "isolation='thread' is unknown"),
        (
            "custom_envs.Countdown.service_url=localhost:8000",
            "write each as http://host:port",
        ),
        ("train_env_manager.max_worker_restarts=-1", "max_worker_restarts=-1"),
    ],
)
def test_bad_placement_config_is_rejected(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/countdown.yaml", [override])


def test_isolation_with_a_service_url_is_rejected():
    with pytest.raises(ConfigError, match="remove isolation"):
        load_config(
            "configs/countdown.yaml",
            [
                "custom_envs.Countdown.isolation=process",
                "custom_envs.Countdown.service_url=http://127.0.0.1:1",
            ],
        )


# -- through the rollout loop (LocalRolloutScheduler, FakeEngine: the fake engine is only for speed) --------


def faulty_config(
    placement: dict,
    *,
    fault_probability: float,
    batches_of: int = 4,
    timeout_s: float = 1.0,
):
    from roll_async.config.schema import (
        CustomEnvConfig,
        EnvManagerConfig,
        GenerationConfig,
        PipelineConfig,
        validate_config,
    )

    config = PipelineConfig(
        rollout_batch_size=batches_of,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Flaky": CustomEnvConfig(
                env_type="faulty",
                env_config={
                    "inner_env_type": "countdown",
                    "fault": "hang",
                    "fault_probability": fault_probability,
                },
                max_steps=2,
                max_tokens_per_step=16,
                **placement,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2,
            group_size=2,
            tags=["Flaky"],
            env_step_timeout_s=timeout_s,
            max_env_num_per_worker=8,
        ),
    )
    validate_config(config)
    return config


@pytest.fixture(scope="module")
def chatml_tokenizer():
    from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer

    return build_chatml_test_tokenizer()


def local_scheduler(config, tokenizer):
    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.scheduler.local import LocalRolloutScheduler
    from roll_async.testing.fake_engine import FakeEngine

    reply = tokenizer("<answer>1 + 2</answer>", add_special_tokens=False)[
        "input_ids"
    ] + [tokenizer.eos_token_id]
    return LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(lambda r: reply),
        tokenizer=tokenizer,
    )


@pytest.mark.slow
async def test_isolated_hung_envs_are_killed_counted_and_replaced_while_the_run_completes(
    chatml_tokenizer,
):
    config = faulty_config({"isolation": "process"}, fault_probability=0.25)
    scheduler = local_scheduler(config, chatml_tokenizer)
    errors, most_processes = 0, 0
    try:
        for step in range(5):
            batch, metrics = await scheduler.get_batch_with_metrics(step)
            assert len(batch) == 4 and all(t.stop_reason != "env_error" for t in batch)
            errors += metrics["rollout/env_errors"]
            most_processes = max(most_processes, len(env_processes()))
            scheduler.resume()
    finally:
        await scheduler.shutdown()
    assert errors >= 1  # P(no fault in >= 40 steps at p=0.25) < 1e-5
    assert sum(m.stats.env_timeouts for m in scheduler.managers) >= 1
    assert most_processes <= 4  # one process per env instance, never more
    deadline = time.monotonic() + 15
    while env_processes() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert env_processes() == []


@pytest.mark.slow
async def test_a_server_that_dies_mid_run_is_the_root_cause_at_get_batch(
    chatml_tokenizer,
):
    from roll_async.env_service.server_cli import launch_server_process
    from roll_async.errors import RolloutFatalError

    process, url = launch_server_process("--env-timeout-s", "30")
    try:
        config = faulty_config(
            {"service_url": url, "service_max_retries": 2},
            fault_probability=0.0,
            timeout_s=10.0,
        )
        scheduler = local_scheduler(config, chatml_tokenizer)
        try:
            batch = await scheduler.get_batch(0)
            assert len(batch) == 4
            process.kill()
            process.wait()
            scheduler.resume()
            with pytest.raises(
                RolloutFatalError,
                match=rf"EnvServiceUnavailable: env server {url} unreachable",
            ):
                await asyncio.wait_for(scheduler.get_batch(1), 120)
        finally:
            await scheduler.shutdown()
    finally:
        process.kill()


async def test_env_timeout_counts_the_call_not_the_wait_for_a_thread():
    """A 0.3 s call that waited 1 s for the only thread still fits a 0.8 s timeout."""
    from concurrent.futures import ThreadPoolExecutor

    from roll_async.env_managers.env_calls import ThreadCall as _ThreadCall

    pool = ThreadPoolExecutor(max_workers=1)
    blocker = asyncio.get_running_loop().run_in_executor(pool, time.sleep, 1.0)
    result = await _ThreadCall(lambda: (time.sleep(0.3), "done")[1], (), None).run(
        pool, 0.8
    )
    assert result == "done"
    await blocker
    # the call itself running past the timeout still times out
    with pytest.raises(asyncio.TimeoutError):
        await _ThreadCall(time.sleep, (2.0,), None).run(pool, 0.3)
    pool.shutdown(wait=True)


async def test_an_env_interrupted_mid_call_is_closed_once_the_call_returns():
    from concurrent.futures import ThreadPoolExecutor

    from roll_async.env_managers.env_calls import ThreadCall as _ThreadCall

    class SlowEnv:
        closed_after_step = None

        def __init__(self):
            self.stepping = False

        def step(self, seconds):
            self.stepping = True
            time.sleep(seconds)
            self.stepping = False

        def close(self):
            SlowEnv.closed_after_step = not self.stepping

    env = SlowEnv()
    pool = ThreadPoolExecutor(max_workers=1)
    call = _ThreadCall(env.step, (1.0,), env)
    with pytest.raises(asyncio.TimeoutError):
        await call.run(pool, 0.2)
    # still running: its thread closes the env when the step returns
    assert call.abandon()
    assert SlowEnv.closed_after_step is None
    pool.shutdown(wait=True)
    assert SlowEnv.closed_after_step is True


async def test_the_server_builds_dotted_path_envs_importable_there(server_url):
    env = RemoteEnv(
        server_url,
        "roll_async.testing.scripted_envs:ScriptedEnv",
        {"episode_length": 2},
        call_timeout_s=30,
    )
    observation, _ = await env.reset(1)
    assert isinstance(observation, str)
    reward = (await env.step("<answer>Up</answer>"))[1]
    assert isinstance(reward, float)
    await env.close()


def test_env_server_import_flag_names_a_module_that_does_not_import():
    from roll_async.env_service.server_cli import launch_server_process

    with pytest.raises(RuntimeError, match="--import no_such_module_xyz"):
        launch_server_process("--import", "no_such_module_xyz", timeout_s=60)


async def test_envs_abandoned_by_a_dead_client_are_reaped_when_idle():
    server = EnvServer(isolation="none", idle_timeout_s=1.0)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        env = RemoteEnv(url, "countdown", {}, call_timeout_s=30)
        await env.reset(1)  # never closed, as if its worker was killed
        deadline = time.monotonic() + 30
        while server.envs and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert server.envs == {} and server.stats.reaped_idle == 1
    finally:
        await runner.cleanup()
