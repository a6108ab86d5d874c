"""Signals: the first SIGINT/SIGTERM stops long waits at once and is remembered; a second one exits the process now."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import ray

from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.pipelines.interrupt import (
    EXIT_INTERRUPTED,
    InterruptFlag,
    RolloutInterrupted,
    RunInterrupted,
    SignalReceived,
    exit_status,
)

REPO = Path(__file__).resolve().parents[3]


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
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


async def test_reclaim_from_a_worker_thread_takes_the_signals_back_on_the_loop():
    """A trainer built in ``asyncio.to_thread`` may start Ray there; reclaim from that thread must not raise
    (it needs the flag's loop, not a running one) and the first SIGTERM is ours again afterwards."""
    flag = InterruptFlag().install()
    try:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(15))  # as ray.init does
        await asyncio.to_thread(flag.reclaim)
        await asyncio.sleep(0)  # the loop runs the re-install
        asyncio.get_running_loop().call_later(
            0.05, os.kill, os.getpid(), signal.SIGTERM
        )
        with pytest.raises(SignalReceived):
            await flag.race(asyncio.sleep(3600))
    finally:
        flag.uninstall()
    assert flag.signal_name == "SIGTERM"


class _Built(Exception):
    """Stands for the rest of the run once the trainer is built."""


@pytest.mark.parametrize(
    "placement", ["trainer.strategy=fsdp2", "trainer.placement=ray_actor"]
)
async def test_a_trainer_in_ray_actors_starts_ray_on_the_loop_thread_and_keeps_sigterm(
    placement, tmp_path, monkeypatch
):
    """The README's fsdp2 command once failed at start-up: Ray was started from the worker thread that
    builds the trainer, and reclaiming the signals there raised. Ray now starts on the loop's (main)
    thread before the trainer is built, and the run's SIGTERM handling survives ray.init's."""
    ray_handler = lambda *_: sys.exit(15)  # noqa: E731 (as ray.init installs)
    started_on: list[threading.Thread] = []

    def fake_init_ray(*args, **kwargs):
        started_on.append(threading.current_thread())
        signal.signal(signal.SIGTERM, ray_handler)  # raises outside the main thread

    seen_while_building: list[object] = []

    def prepare_trainer():
        seen_while_building.append(signal.getsignal(signal.SIGTERM))
        raise _Built

    config = load_config(
        REPO / "configs" / "sokoban.yaml",
        [
            placement,
            "sft_warmup.enabled=false",
            "logging.console=false",
            f"output_dir={tmp_path}",
        ],
    )
    pipeline = AgenticPipeline(config)
    monkeypatch.setattr("roll_async.pipelines.agentic_pipeline.init_ray", fake_init_ray)
    # As in a fresh process: another test in this worker may have started Ray, and this run must
    # neither join nor stop that instance.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
    monkeypatch.setattr(pipeline, "_prepare_trainer", prepare_trainer)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(_Built):
            await pipeline.run(handle_signals=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for handler in list(logging.getLogger().handlers):  # the run's driver.log
            if getattr(handler, "_roll_async_file", False):
                logging.getLogger().removeHandler(handler)
                handler.close()
    assert started_on == [threading.main_thread()]
    assert seen_while_building and seen_while_building[0] is not ray_handler
