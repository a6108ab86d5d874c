"""benchmarks/env_server_load.py: one small run counts every request, the expected fault timeouts and the memory."""

from __future__ import annotations

import argparse
import os

from aiohttp import web

from benchmarks.env_server_load import drive, summarize
from roll_async.env_service.server import EnvServer


async def test_a_small_run_with_hung_envs_has_no_failures_and_loses_nothing():
    server = EnvServer(isolation="none", threads=4)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    args = argparse.Namespace(
        steps_per_session=3,
        max_seconds=30.0,
        call_timeout_s=30.0,
        fault="hang",
        fault_timeout_s=1.0,
        hang_s=3.0,
        slow_s=0.5,
        sample_s=0.1,
    )
    try:
        result = await drive(url, os.getpid(), 40, 4, args)
    finally:
        await runner.cleanup()
    assert (result["failures"], result["lost"], result["envs_left_on_server"]) == (
        0,
        0,
        0,
    )
    assert result["fault_timeouts"] == 4 * 3  # every step of a hung env times out
    assert result["healthy_sessions_completed"] == 40
    assert result["healthy_step_count"] == 40 * 3
    assert result["server_rss_peak_mib"] > 0 and result["rss_timeline"]
    summary = summarize([result, result])
    assert summary["failures"]["median"] == 0 and "healthy_step_p99_ms" in summary
