"""Run a function on N torch.distributed ranks in plain processes (no Ray): how the fsdp2 tests and benchmark drive ranks.

Each process joins a gloo group on the CPU (the same ``init_rank`` the Ray rank
actors use), calls ``fn(info, *args)`` and hands its return value back through a
file, so tensors come back without a queue's shared-memory handles.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from roll_async.errors import RollAsyncError
from roll_async.trainer.parallel.process_group import free_port, init_rank, leave_group


class SpawnedRankError(RollAsyncError, RuntimeError):
    """A spawned rank failed or left no result; the message carries its traceback."""


def _child(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    out: str,
) -> None:
    torch.set_num_threads(1)
    try:
        info = init_rank(rank, world_size, "127.0.0.1", port, torch.device("cpu"))
        result: Any = fn(info, *args)
        leave_group()
        torch.save({"ok": result}, out)
    except BaseException:  # report any failure to the parent
        torch.save({"error": traceback.format_exc()}, out)
        raise


def run_on_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 600.0
) -> list[Any]:
    """``fn(info, *args)`` on ``world_size`` CPU ranks; their results in rank order (a rank's error re-raised)."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        outs = [str(Path(tmp) / f"rank{r}.pt") for r in range(world_size)]
        procs = [
            context.Process(
                target=_child, args=(r, world_size, port, fn, args, outs[r])
            )
            for r in range(world_size)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout_s)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        results = []
        for rank, out in enumerate(outs):
            if not os.path.exists(out):
                raise SpawnedRankError(
                    f"rank {rank} exited without a result (timed out or crashed)"
                )
            payload = torch.load(out, weights_only=False)
            if "error" in payload:
                raise SpawnedRankError(f"rank {rank} failed:\n{payload['error']}")
            results.append(payload["ok"])
    return results
