"""EnvThreadPool: timeouts count from the start, slow or hung calls get extra threads, hung calls clean up."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from roll_async.env_service.fd_limit import raise_open_files_limit
from roll_async.env_service.thread_pool import EnvThreadPool, NoFreeThread


async def test_hung_calls_get_threads_of_their_own_and_the_others_do_not_wait():
    pool = EnvThreadPool(2, max_threads=16, long_call_s=0.05)
    release = threading.Event()
    try:
        hung = [
            asyncio.ensure_future(pool.run(release.wait, 30, timeout=20))
            for _ in range(4)
        ]
        # all four running for longer than long_call_s (polled: a loaded machine starts threads late)
        deadline = time.monotonic() + 10
        while pool.stats()["long_running"] < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert pool.stats()["long_running"] == 4
        # the hung four block for 30 s: these finishing at all means none queued behind them
        results = await asyncio.wait_for(
            asyncio.gather(
                *(pool.run(lambda i=i: i * 2, timeout=20) for i in range(50))
            ),
            timeout=15,
        )
        assert results == [i * 2 for i in range(50)]
        assert not any(h.done() for h in hung)
        assert pool.stats()["threads"] >= 6  # four hung + two free
        release.set()
        assert await asyncio.gather(*hung) == [True] * 4
    finally:
        release.set()
        pool.shutdown()


async def test_a_timeout_counts_from_the_start_and_the_abandoned_call_cleans_up():
    pool = EnvThreadPool(1, max_threads=1)
    cleaned: list[object] = []
    try:
        blocker = asyncio.ensure_future(pool.run(time.sleep, 0.5, timeout=5))
        # waits ~0.5 s for the only thread, then runs 0.2 s: fits a 0.6 s timeout
        assert (
            await pool.run(lambda: (time.sleep(0.2), "done")[1], timeout=0.6) == "done"
        )
        await blocker
        with pytest.raises(TimeoutError):
            await pool.run(
                lambda: (time.sleep(0.6), "late")[1],
                timeout=0.2,
                cleanup=cleaned.append,
            )
        assert pool.stats()["abandoned"] == 1
        deadline = time.monotonic() + 5
        while not cleaned and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert cleaned == [
            "late"
        ]  # the env the late call returned is handed to cleanup
    finally:
        pool.shutdown()


async def test_a_call_that_finds_no_free_thread_fails_without_running():
    pool = EnvThreadPool(1, max_threads=1, long_call_s=0.05)
    release = threading.Event()
    ran: list[int] = []
    try:
        hung = asyncio.ensure_future(pool.run(release.wait, 10, timeout=10))
        await asyncio.sleep(0.2)
        with pytest.raises(NoFreeThread, match="no free thread"):
            await pool.run(ran.append, 1, timeout=0.3)
        release.set()
        await hung
        await asyncio.sleep(0.1)
        assert ran == []  # cancelled while queued: never started
    finally:
        release.set()
        pool.shutdown()


def test_the_open_files_limit_is_raised_toward_the_hard_limit():
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"hard limit {hard} is too low to test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        before, after = raise_open_files_limit(4096)
        assert before == low and after > low
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == after
        assert raise_open_files_limit(1024) == (after, after)  # never lowers it
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_long_queue_is_waited_out_while_threads_may_still_be_started():
    """Queued past its timeout behind a busy thread, the pool not at max_threads: it waits, then runs."""
    pool = EnvThreadPool(1, max_threads=4, long_call_s=10.0)  # no extra thread in time
    try:
        blocker = asyncio.ensure_future(pool.run(time.sleep, 1.0, timeout=5))
        await asyncio.sleep(0.05)
        assert await pool.run(lambda: "ran", timeout=0.3) == "ran"
        await blocker
    finally:
        pool.shutdown()
