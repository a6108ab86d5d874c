"""A vLLM CPU worker that dies by a real SIGILL at its first model step, as on a CPU that cannot run a kernel.

Tests name it as ``engine_kwargs={"worker_cls": SIGILL_WORKER}`` to check, through
the engine's real start-up, that a worker's death by a signal reaches the user
with the signal's name and its likely cause (roll_async.engine.process_deaths).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker

#: vLLM's ``worker_cls`` for this worker (resolved by name in the worker process).
SIGILL_WORKER = f"{__name__}.SigillOnFirstStepWorker"


class SigillOnFirstStepWorker(CPUWorker):  # type: ignore[misc]  # vllm is not followed: its classes are Any
    """Loads and warms up as usual, then raises SIGILL at the first step that runs the model."""

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGILL)
        return super().execute_model(*args, **kwargs)
