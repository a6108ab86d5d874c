"""Env-server calls are applied once: a lost response is retried with the same sequence number,
and the server answers a repeat from its cache instead of stepping the env again.

A real aiohttp env server on the loopback (in-thread envs, so the test reads the env's own record
of what it was asked); faults are injected by a middleware that lets the server apply the call,
then drops the connection before the client has the answer.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from roll_async.env_service.client import EnvServiceClient, RemoteEnv
from roll_async.env_service.server import EnvServer
from roll_async.errors import EnvServiceError

SCRIPTED = "roll_async.testing.scripted_envs:ScriptedEnv"
UP = "<answer>Up</answer>"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ResponseDropper:
    """Lets the server handle a call, then drops the connection instead of answering (``drops[op]`` times).

    ``mode``: ``reset`` (TCP RST, "connection reset by peer"), ``close`` (FIN: "server disconnected")
    or ``partial`` (the status line, headers and part of the body, then RST).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.drops: dict[str, int] = {}
        self.handled: list[
            str
        ] = []  # the op of every call the server handled, dropped or not

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        response = await handler(request)  # the server has applied the call here
        op = request.path.rstrip("/").rsplit("/", 1)[-1]
        self.handled.append(op)
        if self.drops.get(op, 0) <= 0:
            return response
        self.drops[op] -= 1
        transport = request.transport
        assert transport is not None
        if self.mode == "partial":
            body = response.body
            assert isinstance(body, bytes)
            partial = web.StreamResponse(status=200)
            partial.content_type = "application/json"
            partial.content_length = len(body)
            await partial.prepare(request)
            await partial.write(body[: len(body) // 2])
            await asyncio.sleep(0.05)  # let the first half reach the client
        if self.mode in ("reset", "partial"):
            sock = transport.get_extra_info("socket")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        transport.abort()
        raise asyncio.CancelledError  # nothing more to send on this connection


async def serve(server: EnvServer, *middlewares: Any) -> tuple[web.AppRunner, str]:
    app = server.app()
    app.middlewares.extend(middlewares)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # loopback, a free port
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def dropping_server() -> AsyncIterator[tuple[EnvServer, ResponseDropper, str]]:
    """Yields (server, dropper, url); closes the server and the shared client after the test."""
    server = EnvServer(isolation="none", threads=4, env_timeout_s=30.0)
    dropper = ResponseDropper("reset")
    runner, url = await serve(server, dropper.middleware)
    try:
        yield server, dropper, url
    finally:
        for max_retries in (1, 3):
            await EnvServiceClient.shared(url, max_retries=max_retries).close()
        await runner.cleanup()


def hosted_env(server: EnvServer, env: RemoteEnv) -> Any:
    assert env.env_id is not None
    return server.envs[env.env_id].env


@pytest.mark.parametrize("mode", ["reset", "close", "partial"])
async def test_a_step_whose_answer_is_lost_is_retried_and_applied_once(
    dropping_server, mode
):
    server, dropper, url = dropping_server
    dropper.mode = mode
    env = RemoteEnv(url, SCRIPTED, {"episode_length": 5}, call_timeout_s=10)
    observation, _ = await env.reset(3)
    assert observation == "s3t0 s3t0"
    dropper.drops["step"] = 1
    observation, reward, terminated, _, _ = await asyncio.wait_for(env.step(UP), 30)
    assert dropper.handled.count("step") == 2  # the client did retry after the drop
    assert hosted_env(server, env).actions == [UP]  # ... and the env advanced once
    assert (observation, reward, terminated) == ("s3t1 s3t1", 1.0, False)
    assert server.stats.repeats == 1
    observation, *_ = await env.step(UP)  # the session goes on in step
    assert observation == "s3t2 s3t2" and hosted_env(server, env).actions == [UP, UP]
    await env.close()


async def test_a_reset_whose_answer_is_lost_is_applied_once(dropping_server):
    server, dropper, url = dropping_server
    env = RemoteEnv(url, SCRIPTED, {"episode_length": 5}, call_timeout_s=10)
    await env.prepare()
    dropper.drops["reset"] = 1
    observation, info = await asyncio.wait_for(env.reset(7), 30)
    assert dropper.handled.count("reset") == 2
    assert hosted_env(server, env).seeds == [7]
    assert observation == "s7t0 s7t0" and info == {"instruction": "Count up."}
    await env.close()


async def test_a_create_whose_answer_is_lost_builds_one_env(dropping_server):
    server, dropper, url = dropping_server
    dropper.drops["envs"] = 1
    env = RemoteEnv(url, SCRIPTED, {}, call_timeout_s=10)
    await asyncio.wait_for(env.prepare(), 30)
    assert dropper.handled.count("envs") == 2
    assert list(server.envs) == [env.env_id] and server.stats.created == 1
    await env.close()
    assert server.envs == {}


async def test_a_call_that_is_not_safe_to_repeat_is_not_retried_after_it_may_have_arrived(
    dropping_server,
):
    """A create without a client-chosen id cannot be deduplicated: the client says so instead of creating twice."""
    server, dropper, url = dropping_server
    dropper.drops["envs"] = 1
    client = EnvServiceClient([url], max_retries=3, retry_backoff_s=0.01)
    try:
        with pytest.raises(
            EnvServiceError, match="may have reached the server"
        ) as info:
            await client.request(
                url, "POST", "/v1/envs", {"env_type": SCRIPTED}, timeout_s=10
            )
    finally:
        await client.close()
    assert info.value.kind == "outcome_unknown"
    assert dropper.handled == ["envs"] and server.stats.created == 1


async def post(
    session: aiohttp.ClientSession, url: str, body: Any
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


async def test_a_repeated_sequence_number_is_answered_from_the_cache(dropping_server):
    server, _, url = dropping_server
    base = f"{url}/v1/envs/c1"
    async with aiohttp.ClientSession() as session:
        created = await post(
            session, f"{url}/v1/envs", {"env_type": SCRIPTED, "env_id": "c1"}
        )
        assert created == (200, {"env_id": "c1"})
        assert (
            await post(
                session, f"{url}/v1/envs", {"env_type": SCRIPTED, "env_id": "c1"}
            )
            == created
        )
        first = await post(session, f"{base}/reset", {"seed": 5, "seq": 1})
        assert await post(session, f"{base}/reset", {"seed": 5, "seq": 1}) == first
        step = await post(session, f"{base}/step", {"action": UP, "seq": 2})
        assert step[0] == 200 and step[1]["observation"] == "s5t1 s5t1"
        for _ in range(3):
            assert await post(session, f"{base}/step", {"action": UP, "seq": 2}) == step
        env = server.envs["c1"].env
        assert (env.seeds, env.actions) == ([5], [UP])
        # the same number for another call, a number skipped, an old one: 409, nothing applied
        for body, reason in [
            ({"action": "<answer>Down</answer>", "seq": 2}, "seq=2 was already used"),
            ({"action": UP, "seq": 4}, "neither the next call (seq=3) nor a repeat"),
            ({"action": UP, "seq": 1}, "neither the next call (seq=3) nor a repeat"),
        ]:
            status, payload = await post(session, f"{base}/step", body)
            assert (status, payload["kind"]) == (409, "out_of_sequence")
            assert reason in payload["error"]
        status, payload = await post(session, f"{base}/reset", {"seed": 5, "seq": 2})
        assert status == 409 and "already used for a step" in payload["error"]
        assert (env.seeds, env.actions) == ([5], [UP])
        assert (await post(session, f"{base}/step", {"action": UP, "seq": 3}))[0] == 200
        assert env.actions == [UP, UP]
        status, payload = await post(
            session, f"{url}/v1/envs", {"env_type": SCRIPTED, "env_id": "c1"}
        )
        assert status == 409 and "past its create (last call seq=3)" in payload["error"]
        # the same over the batch endpoint
        calls = [{"op": "step", "env_id": "c1", "action": UP, "seq": 3}] * 2
        status, payload = await post(session, f"{url}/v1/batch", {"calls": calls})
        assert [r["status"] for r in payload["results"]] == [200, 200]
        assert env.actions == [UP, UP]


async def test_a_repeat_of_a_call_still_running_waits_for_its_answer(dropping_server):
    server, _, url = dropping_server
    base = f"{url}/v1/envs/c2"
    async with aiohttp.ClientSession() as session:
        config = {"step_latency_s": 0.5}
        body = {"env_type": SCRIPTED, "env_config": config, "env_id": "c2", "seed": 1}
        assert (await post(session, f"{url}/v1/envs", body))[0] == 200
        step = {"action": UP, "seq": 1}
        first, second = await asyncio.wait_for(
            asyncio.gather(
                post(session, f"{base}/step", step), post(session, f"{base}/step", step)
            ),
            30,
        )
        assert first == second and first[0] == 200
        assert server.envs["c2"].env.actions == [UP]


async def test_a_repeat_of_a_failed_call_gets_the_same_failure(dropping_server):
    server, _, url = dropping_server
    base = f"{url}/v1/envs/c3"
    async with aiohttp.ClientSession() as session:
        config = {"hang_on_step": 0, "hang_s": 1.5}
        body = {"env_type": SCRIPTED, "env_config": config, "env_id": "c3", "seed": 1}
        assert (await post(session, f"{url}/v1/envs", body))[0] == 200
        step = {"action": UP, "seq": 1, "timeout_s": 0.3}
        failed = await post(session, f"{base}/step", step)
        assert failed[0] == 500 and failed[1]["kind"] == "timeout"
        assert await post(session, f"{base}/step", step) == failed
        status, payload = await post(session, f"{base}/step", {**step, "seq": 2})
        assert (status, payload["kind"]) == (404, "not_found")
        assert "exceeded timeout_s=0.3" in payload["error"]
        assert server.stats.timeouts == 1


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"action": UP}, "missing field 'seq'"),
        ({"action": UP, "seq": "2"}, "field 'seq' must be int, got str"),
        ({"action": UP, "seq": 2.0}, "field 'seq' must be int, got float"),
        ({"action": UP, "seq": True}, "field 'seq' must be a number, got a boolean"),
        (
            {"action": UP, "seq": -1},
            "field 'seq' must be a non-negative integer, got -1",
        ),
    ],
)
async def test_a_malformed_sequence_number_is_a_400_naming_the_field(
    dropping_server, body, reason
):
    server, _, url = dropping_server
    async with aiohttp.ClientSession() as session:
        created = {"env_type": SCRIPTED, "env_id": "c4", "seed": 1}
        assert (await post(session, f"{url}/v1/envs", created))[0] == 200
        status, payload = await post(session, f"{url}/v1/envs/c4/step", body)
        assert (status, payload["kind"]) == (400, "bad_request")
        assert reason in payload["error"]
        reset = {"seed": 1, **{k: v for k, v in body.items() if k == "seq"}}
        status, payload = await post(session, f"{url}/v1/envs/c4/reset", reset)
        assert status == 400 and reason in payload["error"]
    assert server.envs["c4"].env.actions == [] and server.envs["c4"].env.seeds == [1]


async def test_a_server_that_restarted_answers_a_clear_error_and_steps_nothing():
    """The session is gone with the old server: the client's step is a 404 that says so, never a fresh env stepped."""
    first = EnvServer(isolation="none", threads=2)
    runner, url = await serve(first)
    port = int(url.rsplit(":", 1)[1])
    env = RemoteEnv(url, SCRIPTED, {}, call_timeout_s=10, max_retries=1)
    second = EnvServer(isolation="none", threads=2)
    runner2 = web.AppRunner(second.app(), access_log=None)
    try:
        await env.reset(1)
        await env.step(UP)
        await runner.cleanup()
        await runner2.setup()
        await web.TCPSite(runner2, "127.0.0.1", port).start()
        with pytest.raises(EnvServiceError, match="server restarted") as info:
            await asyncio.wait_for(env.step(UP), 30)
        assert info.value.kind == "not_found" and env.env_id is None
        assert second.envs == {} and second.stats.calls == 0
    finally:
        await EnvServiceClient.shared(url, max_retries=1).close()
        await runner.cleanup()
        await runner2.cleanup()


async def test_a_call_the_server_did_not_apply_gives_its_number_back(dropping_server):
    """Two steps at once on one env: one is refused busy (not applied), and the session's numbers stay in step."""
    server, _, url = dropping_server
    env = RemoteEnv(url, SCRIPTED, {"step_latency_s": 0.3}, call_timeout_s=10)
    await env.reset(2)
    results = await asyncio.wait_for(
        asyncio.gather(env.step(UP), env.step(UP), return_exceptions=True), 30
    )
    refused = [r for r in results if isinstance(r, EnvServiceError)]
    assert len(refused) == 1 and refused[0].kind == "busy"
    assert env.seq == 2 and hosted_env(server, env).actions == [UP]
    observation, *_ = await env.step(UP)
    assert observation == "s2t2 s2t2" and hosted_env(server, env).actions == [UP, UP]
    await env.close()
