"""Can this CPU run vLLM's bfloat16 kernels? Asked once per process, in a child process, before an engine starts.

On an Intel Xeon VM whose CPU lists AMX and AVX-512-BF16, the kernels vLLM's CPU
backend picks for bfloat16 died by SIGILL in the engine's worker, so every engine
with ``engine.dtype: auto`` (bfloat16 on CPU) failed at start-up with only
"EngineCore encountered an issue", while float32 engines ran. The probe runs
the same ops on small inputs in a throwaway process and checks them against
float32; a death (SIGILL) or an error there means bfloat16 cannot be used.
roll_async.engine.engine_args.engine_dtype decides what follows.

The child calls the kernels vLLM's CPU code dispatches to for bfloat16
(vllm/model_executor/layers/utils.py ``dispatch_cpu_unquantized_gemm``,
vllm/v1/attention/backends/cpu_attn.py): oneDNN ``onednn_mm`` for linears, the
AMX brgemm ``weight_packed_linear`` for small weights where the CPU lists AMX,
and ``cpu_attn_reshape_and_cache`` / ``cpu_attention_with_kv_cache`` with the
ISA vLLM picks (amx where listed, else vec). It loads vLLM's kernel library
directly (``torch.ops.load_library``, the library ``CpuPlatform.import_kernels``
imports) and calls ``torch.ops._C`` as vllm._custom_ops' wrappers do: importing
the vllm package for those wrappers took 11-18 s on a loaded 2-core machine; the
probe costs about one torch import (1.7-3.6 s there, cached per process).
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
import time
from dataclasses import dataclass

from roll_async.engine.process_deaths import signal_of

logger = logging.getLogger(__name__)

#: Seconds the child may take (a loaded machine imports torch slowly); past it bfloat16 counts as unusable.
PROBE_TIMEOUT_S = 180.0
#: The child's command line (roll_async.engine.cpu_bf16_kernels; not imported here, so it runs cleanly as __main__).
PROBE_ARGV = [sys.executable, "-m", "roll_async.engine.cpu_bf16_kernels"]


@dataclass(frozen=True)
class Bf16Probe:
    """The probe's verdict: whether bfloat16 kernels run here, what showed it, and what it cost."""

    usable: bool
    detail: str
    seconds: float


@functools.cache
def cpu_bf16_probe() -> Bf16Probe:
    """Run the bfloat16 kernels in a child process (once per process; the verdict is cached)."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            PROBE_ARGV, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        probe = Bf16Probe(
            False,
            f"the probe of vLLM's bfloat16 CPU kernels did not finish within {PROBE_TIMEOUT_S:.0f} s",
            time.monotonic() - start,
        )
    else:
        probe = _verdict(done, time.monotonic() - start)
    logger.info(
        "CPU bfloat16 probe (%.1f s): %s",
        probe.seconds,
        probe.detail if probe.usable else f"unusable: {probe.detail}",
    )
    return probe


def _verdict(done: subprocess.CompletedProcess[str], seconds: float) -> Bf16Probe:
    if done.returncode == 0:
        lines = done.stdout.strip().splitlines()
        return Bf16Probe(True, lines[-1] if lines else "ran", seconds)
    sig = signal_of(done.returncode)
    if sig is not None:
        detail = f"a process running vLLM's bfloat16 CPU kernels died by {sig.name}"
    else:
        errors = done.stderr.strip().splitlines()
        last = errors[-1] if errors else f"exit code {done.returncode}"
        detail = f"vLLM's bfloat16 CPU kernels failed: {last}"
    return Bf16Probe(False, detail, seconds)
