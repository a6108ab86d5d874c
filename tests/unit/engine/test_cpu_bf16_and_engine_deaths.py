"""bfloat16 on a CPU that cannot run vLLM's kernels is found before an engine starts; a death by a signal is named.

An Intel Xeon VM listing AMX and AVX-512-BF16 killed every bfloat16 engine's
worker with SIGILL at start-up and the user saw only "EngineCore encountered an
issue". Here (an AMD EPYC, where bfloat16 runs) the probe runs for real, and its
failure is a probe child that really dies by SIGILL.
"""

from __future__ import annotations

import faulthandler
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pipelines.preflight import preflight
from roll_async.config.schema import EngineConfig, PipelineConfig
from roll_async.engine import cpu_bf16_probe as probe_module
from roll_async.engine import engine_args, exit_recording_executor, process_deaths
from roll_async.engine.exit_recording_executor import ExitRecordingExecutor
from roll_async.errors import ConfigError

needs_cpu_vllm = pytest.mark.skipif(
    not engine_args.is_cpu_platform(),
    reason="the bfloat16 probe is for vLLM's CPU backend",
)

DIES_BY_SIGILL = [
    sys.executable,
    "-c",
    "import os, signal; os.kill(os.getpid(), signal.SIGILL)",
]


@pytest.fixture
def fresh_probe(monkeypatch):
    """The per-process verdict and the one-time warning forgotten before and after the test."""
    probe_module.cpu_bf16_probe.cache_clear()
    engine_args._warn_float32_once.cache_clear()
    yield monkeypatch
    probe_module.cpu_bf16_probe.cache_clear()
    engine_args._warn_float32_once.cache_clear()


@pytest.fixture
def bf16_dies_by_sigill(fresh_probe):
    fresh_probe.setattr(probe_module, "PROBE_ARGV", DIES_BY_SIGILL)


@needs_cpu_vllm
def test_the_probe_runs_vllms_bf16_kernels_in_a_child_once_per_process(fresh_probe):
    start = time.monotonic()
    probe = probe_module.cpu_bf16_probe()
    first = time.monotonic() - start
    # either vendor: the kernels ran and matched float32, or the child died by a signal (never a probe error)
    assert probe.usable or "died by SIG" in probe.detail, probe.detail
    if probe.usable:
        assert (
            "onednn_mm" in probe.detail
            and "cpu_attention_with_kv_cache" in probe.detail
        )
    start = time.monotonic()
    assert probe_module.cpu_bf16_probe() is probe  # cached: no second child
    assert time.monotonic() - start < 0.01
    print(f"probe: {probe.detail}; {first:.2f} s")


@needs_cpu_vllm
def test_auto_falls_back_to_float32_with_one_warning(bf16_dies_by_sigill, caplog):
    with caplog.at_level(logging.WARNING, logger=engine_args.__name__):
        assert engine_args.engine_dtype("auto") == "float32"
        args = engine_args.build_engine_args("/some/model", EngineConfig())
    assert args.dtype == "float32"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "engine.dtype=auto runs the engine in float32" in warnings[0]
    assert "SIGILL" in warnings[0]
    assert engine_args.engine_dtype("float32") == "float32"


@needs_cpu_vllm
def test_explicit_bfloat16_fails_at_load_in_one_line_naming_float32(
    bf16_dies_by_sigill,
):
    config = PipelineConfig(engine=EngineConfig(dtype="bfloat16"))
    with pytest.raises(ConfigError) as caught:
        preflight(config)  # before any actor or engine
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("engine.dtype=bfloat16: this CPU cannot run")
    assert "SIGILL" in message and message.endswith("set engine.dtype=float32")


@needs_cpu_vllm
def test_a_probe_child_that_errors_counts_as_unusable(fresh_probe):
    fresh_probe.setattr(
        probe_module,
        "PROBE_ARGV",
        [sys.executable, "-c", "raise RuntimeError('onednn_mm: no kernel')"],
    )
    probe = probe_module.cpu_bf16_probe()
    assert not probe.usable
    assert "RuntimeError: onednn_mm: no kernel" in probe.detail
    with pytest.raises(ConfigError, match="RuntimeError: onednn_mm: no kernel"):
        engine_args.engine_dtype("bfloat16")


def test_explicit_bfloat16_names_the_judges_key(bf16_dies_by_sigill, monkeypatch):
    monkeypatch.setattr(engine_args, "is_cpu_platform", lambda: True)
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Judge\.reward\.engine\.dtype=bfloat16: .*; set custom_envs\.Judge\.reward\.engine\.dtype=float32$",
    ):
        engine_args.engine_dtype("bfloat16", "custom_envs.Judge.reward.engine.dtype")


def exit_code_of_a_death_by(sig: signal.Signals) -> int:
    return subprocess.run(
        [sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(sig)})"]
    ).returncode


@pytest.mark.parametrize(
    ("sig", "cause"),
    [
        (signal.SIGILL, "cannot run the engine's kernels.*engine.dtype=float32"),
        (signal.SIGKILL, "out-of-memory killer: lower engine.cpu_kv_cache_space_gib"),
        (signal.SIGSEGV, "segmentation fault in native code"),
    ],
)
def test_a_death_by_a_signal_is_named_with_its_likely_cause(sig, cause):
    text = process_deaths.describe_exit("worker", exit_code_of_a_death_by(sig))
    assert text is not None and text.startswith(f"worker died by {sig.name} (")
    assert re.search(cause, text), text
    assert process_deaths.describe_exit("worker", 1) is None
    assert process_deaths.describe_exit("worker", 0) is None


def _die_by_sigill() -> None:
    faulthandler.disable()  # a forked child inherits pytest's handler, which would dump every stack
    os.kill(os.getpid(), signal.SIGILL)


def test_the_executor_records_a_worker_dead_by_sigill_for_its_parent():
    # this process plays the EngineCore (the executor's process); its parent reads the record
    assert (
        importlib.import_module(
            process_deaths.RECORDING_EXECUTOR.rpartition(".")[0]
        ).__dict__[process_deaths.RECORDING_EXECUTOR.rpartition(".")[2]]
        is ExitRecordingExecutor
    )
    since = time.time()
    # forked, as the executor starts its workers: a spawned child re-imports this module (vLLM, torch),
    # which under a loaded CI outlasted the wait and left the worker to be stopped instead of dying
    worker = multiprocessing.get_context("fork").Process(
        target=_die_by_sigill, name="VllmWorker-0"
    )
    healthy = multiprocessing.get_context("fork").Process(
        target=time.sleep, args=(60,), name="VllmWorker-1"
    )
    worker.start()
    healthy.start()
    # dead, not yet reaped
    died = multiprocessing.connection.wait([worker.sentinel], 60)
    assert died, "the SIGILL worker did not die within 60 s"
    try:
        ExitRecordingExecutor._ensure_worker_termination([worker, healthy])
        deaths = process_deaths.deaths_since(os.getppid(), since)
    finally:
        process_deaths.forget_deaths(os.getppid())
        healthy.kill()
    # the worker that died on its own is named; the one vLLM stopped is not
    assert len(deaths) == 1, deaths
    assert deaths[0].startswith(
        f"engine process VllmWorker-0 (pid {worker.pid}) died by SIGILL (illegal instruction"
    )
    assert not healthy.is_alive()


def test_the_engine_core_forks_its_workers_though_its_ray_actor_had_to_spawn(
    monkeypatch,
):
    """vLLM forces ``spawn`` in a Ray actor (the engine's host) and the EngineCore inherits it; the
    EngineCore has no Ray, so the executor forks its workers from it (no second import of vLLM and torch)."""
    from vllm.utils.system_utils import get_mp_context
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    started_with = []
    monkeypatch.setenv(exit_recording_executor.WORKER_START_METHOD, "spawn")
    monkeypatch.setattr(
        MultiprocExecutor,
        "_init_executor",
        lambda self: started_with.append(get_mp_context().get_start_method()),
    )
    ExitRecordingExecutor._init_executor(object.__new__(ExitRecordingExecutor))
    assert started_with == ["fork"]
