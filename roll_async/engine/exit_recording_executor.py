"""vLLM's multiprocess executor, writing down how its workers died for the engine's front-end to report.

A vLLM worker that dies by a signal (SIGILL from a kernel the CPU cannot run,
SIGKILL from the out-of-memory killer) is reaped by the EngineCore process; the
front-end only hears "EngineCore encountered an issue". This subclass runs in
the EngineCore process (build_engine_args names it as vLLM's
``distributed_executor_backend`` where vLLM would use its multiprocess executor
anyway) and records each worker that died by a signal before vLLM stops the
rest, for its parent, the front-end (roll_async.engine.process_deaths). It also
forks those workers from the EngineCore process, which has no Ray, rather than
spawning them (the spawn vLLM forces in the engine's Ray actor is inherited).
"""

from __future__ import annotations

import multiprocessing.connection
import os
from multiprocessing.process import BaseProcess

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from roll_async.engine import process_deaths

#: vLLM's setting for how its worker processes start (``spawn`` or ``fork``).
WORKER_START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


def record_signal_deaths(procs: list[BaseProcess]) -> None:
    """Record each of ``procs`` that has died by a signal (not the ones still running: vLLM stops those)."""
    ready = set(multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0))
    for proc in procs:
        if proc.sentinel in ready:
            proc.join(timeout=5)  # exited: reap it so its exit code is known
        exitcode = proc.exitcode
        if exitcode is not None and process_deaths.signal_of(exitcode) is not None:
            process_deaths.record_exit(os.getppid(), proc.name, proc.pid or 0, exitcode)


class ExitRecordingExecutor(MultiprocExecutor):  # type: ignore[misc]  # vllm is not followed (pyproject [tool.mypy]): its classes are Any
    """MultiprocExecutor that records its workers' deaths by signal (at a failed start or mid-run)."""

    @staticmethod
    def _ensure_worker_termination(worker_procs: list[BaseProcess]) -> None:
        # vLLM calls this when a worker died (monitor -> shutdown) or a start failed, and at shutdown,
        # before it terminates the survivors: what has died by then died on its own.
        try:
            record_signal_deaths(worker_procs)
        finally:
            MultiprocExecutor._ensure_worker_termination(worker_procs)

    def _init_executor(self) -> None:
        # This runs in the EngineCore process, which has neither Ray nor CUDA: its workers can be forked
        # from it, as vLLM does outside Ray, instead of spawned (a fresh interpreter importing vLLM and
        # torch again). "spawn" was forced in the engine's Ray actor, where it is needed, and inherited.
        if os.environ.get(WORKER_START_METHOD) == "spawn":
            os.environ[WORKER_START_METHOD] = "fork"
        super()._init_executor()
