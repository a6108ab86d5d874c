"""Engine start-up errors and shutdown hygiene: each test owns its engine (not the shared one)."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from roll_async.config.schema import EngineConfig
from roll_async.engine import VLLMEngine
from roll_async.errors import EngineStartupError
from roll_async.model.paths import resolve_model_path
from roll_async.testing.dying_worker import SIGILL_WORKER

pytestmark = pytest.mark.integration


def test_missing_model_path_names_the_path_and_the_fix():
    with pytest.raises(
        FileNotFoundError, match=r"model.path='/nonexistent/model'.*make-tiny-model"
    ):
        resolve_model_path("/nonexistent/model")


async def test_engine_start_with_missing_path_fails_fast():
    engine = VLLMEngine("/nonexistent/model", EngineConfig())
    with pytest.raises(EngineStartupError, match="does not exist"):
        await engine.start()


async def test_unknown_engine_option_is_named(tiny_model_path):
    engine = VLLMEngine(
        str(tiny_model_path), EngineConfig(engine_kwargs={"max_num_seqz": 4})
    )
    with pytest.raises(EngineStartupError, match="max_num_seqz"):
        await engine.start()


async def test_option_value_vllm_rejects_is_named(tiny_model_path):
    engine = VLLMEngine(str(tiny_model_path), EngineConfig(dtype="float7"))
    with pytest.raises(EngineStartupError, match="dtype=float7"):
        await engine.start()


@pytest.mark.slow
async def test_shutdown_leaves_no_vllm_process(ray_session, tiny_model_path):
    from roll_async.engine.engine_actor import launch_engines, shutdown_engines

    (actor,) = await launch_engines(
        str(tiny_model_path),
        EngineConfig(max_model_len=256, max_num_seqs=8),
        name_prefix="lifecycle_engine",
    )
    host_pid = (await actor.info.remote())["pid"]
    children = psutil.Process(host_pid).children(recursive=True)
    assert children, (
        "vLLM should run its EngineCore in a child process of the engine actor"
    )
    await shutdown_engines([actor])
    deadline = time.monotonic() + 30
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [
            p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
        time.sleep(0.2)
    assert not alive, (
        f"processes left after shutdown: {[(p.pid, p.name()) for p in alive]}"
    )


@pytest.mark.slow
async def test_a_worker_dead_by_sigill_is_named_with_the_cause_and_the_fix(
    tiny_model_path,
):
    # vLLM's CPU worker really dies by SIGILL at its first step (as on a CPU that cannot run a kernel);
    # the start reports the signal, its cause and engine.dtype=float32, not "EngineCore encountered an issue"
    engine = VLLMEngine(
        str(tiny_model_path),
        EngineConfig(
            max_model_len=256,
            max_num_seqs=8,
            engine_kwargs={"worker_cls": SIGILL_WORKER},
        ),
    )
    try:
        with pytest.raises(EngineStartupError) as caught:
            await engine.start()
    finally:
        await engine.shutdown()
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(
        r"engine process VllmWorker\S* \(pid \d+\) died by SIGILL \(illegal instruction: this CPU "
        r".*set engine\.dtype=float32\)$",
        message,
    ), message
