"""The env server under many concurrent sessions: every one answered, and a hung env costs only its own session."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from roll_async.env_service.client import EnvServiceClient, RemoteEnv
from roll_async.env_service.server import EnvServer
from roll_async.errors import EnvServiceError

WRONG = "<answer>1 + 1</answer>"


async def serve(server: EnvServer) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def health(url: str) -> dict:
    async with aiohttp.ClientSession() as session:
        return await (await session.get(url + "/health")).json()


def test_in_thread_servers_hold_thousands_of_envs_by_default():
    assert EnvServer(isolation="none").max_envs >= 2000
    assert EnvServer(isolation="process").max_envs == 256


async def test_every_one_of_200_concurrent_sessions_is_answered():
    """200 sessions at once (create, reset, 3 steps, close each): no failure, nothing lost, nothing left."""
    server = EnvServer(isolation="none", threads=8)
    runner, url = await serve(server)
    failures: list[str] = []
    answered = [0]

    async def session(i: int) -> None:
        env = RemoteEnv(url, "countdown", {"max_steps": 3}, call_timeout_s=30)
        try:
            await env.prepare()
            await env.reset(i)
            for _ in range(3):
                await env.step(WRONG)
            answered[0] += 5
            await env.close()
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            failures.append(f"{type(exc).__name__}: {exc}")

    try:
        await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(200))), 120)
        state = await health(url)
    finally:
        await EnvServiceClient.shared(url).close()
        await runner.cleanup()
    assert failures == []
    assert answered[0] == 200 * 5
    assert state["envs"] == 0
    assert state["stats"]["created"] == 200 and state["stats"]["closed"] == 200
    assert state["stats"]["timeouts"] == 0


async def test_hung_envs_do_not_hold_up_the_other_sessions():
    """Four envs hang in step (more than the server's two free threads); 20 healthy sessions never wait for them."""
    server = EnvServer(isolation="none", threads=2, max_threads=64)
    runner, url = await serve(server)
    hang = {
        "inner_env_type": "countdown",
        "fault": "hang",
        "fault_probability": 1.0,
        "hang_s": 6.0,
    }
    hung_timeout_s = 3.0
    latencies: list[float] = []

    async def hung_session(i: int) -> str:
        env = RemoteEnv(url, "faulty", hang, call_timeout_s=hung_timeout_s)
        await env.reset(i)
        with pytest.raises(EnvServiceError) as info:
            await env.step(WRONG)
        return info.value.kind

    async def healthy_session(i: int) -> None:
        env = RemoteEnv(url, "countdown", {"max_steps": 3}, call_timeout_s=30)
        await env.prepare()
        for _ in range(2):
            started = time.monotonic()
            await env.reset(i)
            latencies.append(time.monotonic() - started)
            for _ in range(3):
                started = time.monotonic()
                await env.step(WRONG)
                latencies.append(time.monotonic() - started)
        await env.close()

    try:
        hung = [asyncio.ensure_future(hung_session(i)) for i in range(4)]
        await asyncio.sleep(0.5)  # the four hung steps hold four threads now
        await asyncio.wait_for(
            asyncio.gather(*(healthy_session(i) for i in range(20))), 30
        )
        assert all(
            not h.done() for h in hung
        )  # the healthy ones finished while the hung ones still hang
        assert max(latencies) < hung_timeout_s - 0.5
        assert await asyncio.gather(*hung) == ["timeout"] * 4
        state = await health(url)
        assert state["stats"]["timeouts"] == 4 and state["envs"] == 0
    finally:
        await EnvServiceClient.shared(url).close()
        await runner.cleanup()


@pytest.mark.slow  # starts a server process (~10 s on a loaded 2-core machine)
async def test_a_hung_in_thread_env_does_not_block_the_server_from_exiting():
    """Ctrl-C stops the server at once even while a hung env call still holds a thread (daemon threads)."""
    import signal

    from roll_async.env_service.server_cli import launch_server_process

    process, url = launch_server_process("--isolation", "none")
    try:
        env = RemoteEnv(
            url,
            "faulty",
            {
                "inner_env_type": "countdown",
                "fault": "hang",
                "fault_probability": 1.0,
                "hang_s": 120.0,
            },
            call_timeout_s=1.0,
        )
        await env.reset(1)
        with pytest.raises(EnvServiceError, match="exceeded timeout_s"):
            await env.step(WRONG)
        await EnvServiceClient.shared(url).close()
        process.send_signal(signal.SIGINT)
        assert (
            await asyncio.to_thread(process.wait, 30) == 0
        )  # not after the 120 s hang
    finally:
        process.kill()
        process.wait()
