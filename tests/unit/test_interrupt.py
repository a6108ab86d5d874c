"""Signals: the first SIGINT/SIGTERM stops long waits at once and is remembered; a second one exits the process now."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from roll_async.pipelines.interrupt import (
    EXIT_INTERRUPTED,
    InterruptFlag,
    RolloutInterrupted,
    RunInterrupted,
    SignalReceived,
    exit_status,
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_first_signal_cancels_the_wait_in_progress(signum):
    flag = InterruptFlag().install()
    cancelled = asyncio.Event()

    async def long_wait():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signum)
        with pytest.raises(SignalReceived):
            await flag.race(long_wait())
    finally:
        flag.uninstall()
    assert (
        cancelled.is_set()
        and flag.is_set
        and flag.signal_name == signal.Signals(signum).name
    )


async def test_work_that_finishes_first_returns_its_result():
    flag = InterruptFlag()
    assert await flag.race(asyncio.sleep(0, result=7)) == 7


def test_second_signal_exits_at_once_with_130():
    script = textwrap.dedent("""
        import asyncio, os, signal, time
        from roll_async.pipelines.interrupt import InterruptFlag
        async def main():
            InterruptFlag().install()
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
            print("still running")
        asyncio.run(main())
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        ),
    )
    assert done.returncode == EXIT_INTERRUPTED and "still running" not in done.stdout


def test_the_message_names_step_and_checkpoint():
    assert str(RunInterrupted(4, "runs/x", "runs/x/checkpoints/step_3", "SIGTERM")) == (
        "interrupted at step 4 (SIGTERM); checkpoint at runs/x/checkpoints/step_3"
    )
    assert "no completed step to checkpoint" in str(RunInterrupted(0, "runs/x", None))


async def test_reclaim_takes_sigterm_back_from_a_library_that_replaced_the_handler():
    """ray.init installs its own SIGTERM handler (sys.exit); after reclaim the first SIGTERM is ours again."""
    flag = InterruptFlag().install()
    try:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(15))  # as ray.init does
        flag.reclaim()
        asyncio.get_running_loop().call_later(
            0.05, os.kill, os.getpid(), signal.SIGTERM
        )
        with pytest.raises(SignalReceived):
            await flag.race(asyncio.sleep(3600))
    finally:
        flag.uninstall()
    assert flag.signal_name == "SIGTERM"


def test_exit_status_is_128_plus_the_signal_number():
    assert exit_status("SIGINT") == EXIT_INTERRUPTED == 130
    assert exit_status("SIGTERM") == 143


def test_the_rollout_message_names_the_batches_kept():
    assert str(RolloutInterrupted(3, "runs/r", "SIGTERM")) == (
        "interrupted at batch 3 (SIGTERM); 3 batches kept in runs/r"
    )
