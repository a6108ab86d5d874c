"""The trainer alone on one GPU: tokens/s, MFU and peak memory for Qwen2.5-0.5B, 1.5B and 7B shapes.

What it runs is the project's own trainer, as a run with ``trainer.strategy=fsdp2`` builds it on one
GPU: :class:`~roll_async.trainer.grpo_trainer.GRPOTrainer` with a ``TrainerConfig`` on one NCCL rank
(torch.distributed, world size 1, ``init_rank``), the model built empty and sharded with FSDP2
(``fully_shard`` per decoder layer with a ``MixedPrecisionPolicy``: bfloat16 compute, float32 master
weights and AdamW state, float32 gradient reduction; roll_async.trainer.parallel.sharding), filled from
the checkpoint by the main rank (roll_async.trainer.model_loading), packed micro-batches of at most
``trainer.max_tokens_per_micro_batch`` tokens (roll_async.trainer.micro_batches), gradient
checkpointing, and the clipped-PPO loss step (``train_step``: forward, backward, clip, AdamW). The
Qwen2.5-7B row trains LoRA adapters (``trainer.lora``, rank 16 on q, k, v, o; frozen base in bfloat16).

The models have random weights (no hub download) in the published architectures' shapes: the
hidden size, layers, heads, KV heads, MLP width and vocabulary of ``Qwen/Qwen2.5-{0.5B,1.5B,7B}``'s
``config.json``, taken from benchmarks.trainer_sizing (the one copy of those architectures), written
once as a bfloat16 safetensors checkpoint (as published) and loaded by the trainer from disk. The batch
is benchmarks.trainer_packing's generator: rows of skewed lengths, a few near the micro-batch budget.

Reported per model: tokens/s (the batch's tokens over the median step), MFU = 6 N tokens/s over the
GPU's dense bf16 peak (N: the parameters a token's forward multiplies by, the decoder layers and the
output head; 989 TFLOP/s assumed for H100 SXM and H200, 756 for H100 PCIe; ``--peak-tflops`` for others;
6 N counts no attention FLOPs nor the checkpointed forward's recompute, and over-counts LoRA, whose
backward computes no weight gradient of the frozen base), and peak GPU memory
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the timed steps) against the bytes
benchmarks.trainer_sizing computes for the same setup (fsdp2 on 1 rank, bf16, checkpointing, the same
micro-batch tokens; docs/trainer-sizing.md is that module's page).

Each model runs in its own process, under a deadline: the whole run's ``--budget-s`` is shared
between the models (weights 2:3:5, what one model leaves over goes to the next); a model's process
stops timing steps when the next would pass its deadline and is killed at it, and the result records
what it skipped. The default 420 s keeps the whole command under 8 minutes on an H100.

Without CUDA (or with ``--cpu``) it runs a reduced mode: the same three rows with tiny shapes (the
published models' tying and LoRA, 2 layers, hidden 64-128, vocabulary 1024), gloo instead of NCCL,
bfloat16 compute under FSDP2 on the CPU, a few steps; it checks that the script runs end to end
(tests/unit/benchmarks/test_bench_gpu_trainer.py), its figures say nothing about a GPU.

It needs torch, transformers, peft, numpy, safetensors and pyyaml only (no Ray, vLLM or omegaconf),
so it runs from a bare working tree on a GPU node:

    PYTHONPATH=. python -m benchmarks.gpu_trainer            # -> benchmarks/results/gpu_trainer_<gpu>.{json,md}
    scripts/gpu_check.sh                                      # the same, checking the packages first
    python -m benchmarks.gpu_trainer --cpu                    # reduced mode, -> gpu_trainer_cpu.{json,md}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import peft
import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config

from benchmarks import trainer_packing
from benchmarks.common import REPO, ResultFiles, add_output_args, peak_rss_bytes
from benchmarks.trainer_sizing import (
    BY_NAME,
    FSDP2_ONE_RANK,
    GIB,
    LORA_RANK,
    MICRO_BATCH_TOKENS,
    Arch,
    size,
)
from roll_async.config.sections import LoraConfig, TrainerConfig
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.parallel.process_group import free_port, init_rank, leave_group

#: The rows, in the order they run: (model, tuning, share of the time budget).
MODELS: tuple[tuple[str, str, int], ...] = (
    ("Qwen2.5-0.5B", "full", 2),
    ("Qwen2.5-1.5B", "full", 3),
    ("Qwen2.5-7B", "lora", 5),
)
#: Dense bfloat16 tensor-core peaks in TFLOP/s (no 2:4 sparsity), by a name fragment of
#: ``torch.cuda.get_device_name``; the first match wins. H200 has H100 SXM's compute.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
)
#: Reduced (CPU) shapes: (hidden, heads, KV heads, MLP) per row; 2 layers, vocabulary 1024.
REDUCED_SHAPES = {
    "Qwen2.5-0.5B": (64, 4, 2, 160),
    "Qwen2.5-1.5B": (96, 4, 2, 256),
    "Qwen2.5-7B": (128, 4, 2, 320),
}
#: Seconds a model's process keeps free before its deadline (tear-down, writing its result).
DEADLINE_MARGIN_S = 10.0


@dataclasses.dataclass(frozen=True)
class Workload:
    """The batch and micro-batch budget one mode trains on (GPU defaults; ``reduced`` for the CPU)."""

    rows: int
    long_rows: int
    micro_batch_tokens: int
    short: tuple[int, int]
    prompt_len: int
    group_size: int

    @classmethod
    def for_mode(cls, cpu: bool) -> Workload:
        if cpu:
            return cls(8, 1, 256, (16, 64), 8, 4)
        return cls(64, 8, MICRO_BATCH_TOKENS, (256, 1024), 128, 8)


def reduced(arch: Arch) -> Arch:
    """``arch`` at CPU scale: its tying, bias and norm layout, 2 layers and tiny widths."""
    hidden, heads, kv_heads, mlp = REDUCED_SHAPES[arch.name]
    return dataclasses.replace(
        arch,
        name=f"{arch.name} (reduced)",
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        vocab_size=1024,
        published_total_b=0.0,
        published_non_embedding_b=None,
    )


def arch_for(model: str, cpu: bool) -> Arch:
    arch = BY_NAME[model]
    return reduced(arch) if cpu else arch


def matmul_params(arch: Arch) -> int:
    """The parameters a token's forward multiplies by: decoder layers and the output head (not the input lookup)."""
    return arch.non_embedding_params() + arch.vocab_size * arch.hidden_size


def computed_bytes(arch: Arch, tuning: str, tokens: int) -> int:
    """benchmarks.trainer_sizing's peak bytes for this row: fsdp2 on 1 rank, bf16, checkpointing."""
    return size(
        arch, FSDP2_ONE_RANK, "bf16", tuning, tokens=tokens, checkpointing=True
    ).total


def peak_tflops(device_name: str | None) -> float | None:
    """The dense bf16 peak of ``device_name`` (None for a CPU or an unknown GPU)."""
    if not device_name:
        return None
    for fragment, tflops in PEAK_BF16_TFLOPS:
        if fragment in device_name:
            return tflops
    return None


def device_slug(device_name: str | None) -> str:
    """``h100``, ``h200``, ... from the GPU's name (``gpu`` when it names no model); ``cpu`` without one."""
    if not device_name:
        return "cpu"
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device_name)
    return found.group(1).lower() if found else "gpu"


# ---------------------------------------------------------------------------------------
# One model, in its own process


def host_peak_reader() -> Any:
    """A function giving this process's peak RSS from now on (since start where the peak cannot be reset)."""
    try:
        peak_rss_bytes(reset=True)
    except OSError:  # /proc/self/clear_refs not writable (some containers)
        pass
    return peak_rss_bytes


def qwen2_config(arch: Arch) -> Any:
    """A transformers Qwen2Config of ``arch``'s shapes (Qwen2.5's layout: bias on q, k, v)."""
    if arch.qk_norm or not arch.qkv_bias or arch.hidden_size % arch.num_attention_heads:
        raise ValueError(f"{arch.name} is not a Qwen2 architecture")
    return Qwen2Config(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=arch.tie_word_embeddings,
        use_sliding_window=False,
    )


def write_random_checkpoint(arch: Arch, directory: Path, device: torch.device) -> int:
    """A random-init model of ``arch`` saved to ``directory`` in bfloat16 (initialised on ``device``); its parameter count."""
    config = qwen2_config(arch)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return params


def run_model(args: argparse.Namespace) -> None:
    """The child: build the trainer for ``args.child``, warm up, time steps until done or the deadline; write JSON as it goes."""
    out = Path(args.child_out)
    result: dict[str, Any] = {"model": args.child, "status": "starting"}

    def save(status: str) -> None:
        """Written whole or not at all: the parent may kill this process at any moment."""
        result["status"] = status
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(result, indent=2))
        os.replace(partial, out)

    cpu = args.cpu
    workload = Workload.for_mode(cpu)
    model, tuning, _ = next(m for m in MODELS if m[0] == args.child)
    arch = arch_for(model, cpu)
    device = torch.device("cpu" if cpu else "cuda:0")
    if cpu:  # a smoke run on shared CI cores: one thread, as the CPU benchmarks
        torch.set_num_threads(1)
    result.update(
        arch=arch.name,
        tuning=tuning,
        parameters=arch.total_params(),
        matmul_parameters=matmul_params(arch),
        micro_batch_tokens=workload.micro_batch_tokens,
        computed_bytes=computed_bytes(arch, tuning, workload.micro_batch_tokens),
    )
    save("building")
    try:
        rank = init_rank(0, 1, "127.0.0.1", free_port(), device)
        result["backend"] = torch.distributed.get_backend()
        with tempfile.TemporaryDirectory(
            prefix="gpu_trainer_", dir=args.tmp_dir
        ) as tmp:
            started = time.perf_counter()
            result["checkpoint_parameters"] = write_random_checkpoint(
                arch, Path(tmp), device
            )
            result["write_checkpoint_s"] = time.perf_counter() - started
            config = TrainerConfig(
                device=str(device),
                lr=1e-6,
                max_grad_norm=1.0,
                param_dtype="bfloat16",
                reduce_dtype="float32",
                strategy="fsdp2",
                num_ranks=1,
                gpus_per_rank=0.0 if cpu else 1.0,
                gradient_checkpointing=True,
                max_tokens_per_micro_batch=workload.micro_batch_tokens,
                lora=LoraConfig(rank=LORA_RANK, alpha=2.0 * LORA_RANK)
                if tuning == "lora"
                else LoraConfig(),
            )
            started = time.perf_counter()
            trainer = GRPOTrainer(config, tmp, rank=rank)
            result["build_trainer_s"] = time.perf_counter() - started
        batch = trainer_packing.make_batch(
            argparse.Namespace(
                rows=workload.rows,
                long_rows=workload.long_rows,
                max_len=workload.micro_batch_tokens,
                short=list(workload.short),
                prompt_len=workload.prompt_len,
                group_size=workload.group_size,
                seed=0,
            ),
            arch.vocab_size,
        )
        result.update(
            batch_tokens=int(batch.attention_mask.sum()),
            batch_rows=int(batch.input_ids.shape[0]),
            micro_batches=len(trainer.plan(batch)),
            packed=trainer.packing,
            attention=getattr(trainer.model.config, "_attn_implementation", None),
        )
        save("warming up")

        def step(n: int) -> tuple[float, float]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            metrics = trainer.train_step(batch, n)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - began, metrics["train/loss"]

        result["warmup_s"], result["warmup_loss"] = step(0)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        host_peak = host_peak_reader()
        result["step_s"], result["losses"] = [], []
        while len(result["step_s"]) < args.steps:
            last = result["step_s"][-1] if result["step_s"] else result["warmup_s"]
            if time.time() + last > args.deadline:
                result["skipped"] = (
                    f"{args.steps - len(result['step_s'])} of {args.steps} timed steps "
                    "(the next would pass the deadline)"
                )
                break
            seconds, loss = step(len(result["step_s"]) + 1)
            result["step_s"].append(seconds)
            result["losses"].append(loss)
            result["peak_rss_bytes"] = host_peak()
            if device.type == "cuda":
                result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            save("timing")
        result.update(trainer.memory())
        save("done")
    except BaseException:
        result["error"] = traceback.format_exc()[-4000:]
        save("failed")
        raise
    finally:
        leave_group()


# ---------------------------------------------------------------------------------------
# The parent: one process per model under a shared budget, then the result


def child_command(
    args: argparse.Namespace, model: str, out: Path, deadline: float
) -> list[str]:
    command = [sys.executable, "-m", "benchmarks.gpu_trainer", "--child", model]
    command += ["--child-out", str(out), "--deadline", repr(deadline)]
    command += ["--steps", str(args.steps)]
    if args.cpu:
        command.append("--cpu")
    if args.tmp_dir:
        command += ["--tmp-dir", args.tmp_dir]
    return command


def child_env() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH and the hub offline (nothing is downloaded)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def run_models(
    args: argparse.Namespace, models: list[tuple[str, str, int]]
) -> list[dict[str, Any]]:
    """Each model in its own process; the budget left is shared by the weights of the models left."""
    end = time.time() + args.budget_s
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_trainer_results_") as tmp:
        for i, (model, _, _) in enumerate(models):
            left = end - time.time()
            weights = [w for _, _, w in models[i:]]
            share = left * weights[0] / sum(weights)
            out = Path(tmp) / f"{i}.json"
            print(f"[{model}] up to {share:.0f} s", flush=True)
            if share < 2 * DEADLINE_MARGIN_S:
                rows.append(
                    {"model": model, "status": "skipped: no time left in --budget-s"}
                )
                continue
            started = time.time()
            try:
                proc = subprocess.run(
                    child_command(
                        args, model, out, started + share - DEADLINE_MARGIN_S
                    ),
                    cwd=REPO,
                    env=child_env(),
                    timeout=share,
                )
                outcome = None if proc.returncode == 0 else f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                outcome = f"killed at its {share:.0f} s deadline"
            row = {
                "model": model,
                **(json.loads(out.read_text()) if out.exists() else {}),
            }
            row["wall_s"] = time.time() - started
            if outcome is not None:
                row["status"] = f"{row.get('status', 'not started')}, {outcome}"
            rows.append(row)
            print(f"[{model}] {row['status']} in {row['wall_s']:.0f} s", flush=True)
    return rows


def summarise(row: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """tokens/s, model TFLOP/s and MFU of a row that timed at least one step (the row unchanged otherwise)."""
    steps = row.get("step_s") or []
    if not steps:
        return row
    median = statistics.median(steps)
    tokens_per_s = row["batch_tokens"] / median
    tflops = 6 * row["matmul_parameters"] * tokens_per_s / 1e12
    row.update(
        step_s_median=median,
        tokens_per_s=tokens_per_s,
        model_tflops=tflops,
        mfu=tflops / peak if peak else None,
    )
    if row.get("peak_allocated_bytes"):
        row["allocated_over_computed"] = (
            row["peak_allocated_bytes"] / row["computed_bytes"]
        )
    return row


def _gib(value: Any) -> str:
    return f"{value / GIB:.3g}" if isinstance(value, (int, float)) and value else "n/a"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | tuning | tokens/step | step s, median (n) | tokens/s | model TFLOP/s | MFU "
        "| peak allocated GiB | peak reserved GiB | computed GiB | allocated / computed | host peak RSS GiB | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        timed = "step_s_median" in r
        mfu = r.get("mfu")
        ratio = r.get("allocated_over_computed")
        status = r.get("status", "")
        if r.get("skipped"):
            status += f"; skipped {r['skipped']}"
        cells = [
            r.get("arch", r["model"]),
            r.get("tuning", ""),
            f"{r['batch_tokens']:,}" if "batch_tokens" in r else "n/a",
            f"{r['step_s_median']:.2f} ({len(r['step_s'])})" if timed else "n/a",
            f"{r['tokens_per_s']:,.0f}" if timed else "n/a",
            f"{r['model_tflops']:.3g}" if timed else "n/a",
            f"{mfu:.1%}" if mfu is not None else "n/a",
            _gib(r.get("peak_allocated_bytes")),
            _gib(r.get("peak_reserved_bytes")),
            _gib(r.get("computed_bytes")),
            f"{ratio:.2f}" if ratio else "n/a",
            _gib(r.get("peak_rss_bytes")),
            status,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    gpu = result["machine"].get("gpu")
    peak = result["peak_bf16_tflops"]
    w = result["workload"]
    lines = [
        "# The trainer alone on one GPU: tokens/s, MFU, peak memory",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}  ",
        f"Libraries: {result['versions']}  ",
        (
            f"Device: {gpu}; MFU against {peak:g} TFLOP/s dense bf16."
            if gpu and peak
            else f"Device: {gpu}; no known bf16 peak, so no MFU (pass --peak-tflops)."
            if gpu
            else "Reduced CPU mode (tiny shapes, gloo, bf16 compute under FSDP2 on the CPU): it shows the "
            "script runs end to end; nothing here ran on a GPU and no figure says anything about one."
        ),
        "",
        "GRPOTrainer.train_step, trainer.strategy=fsdp2 on one rank "
        f"({result['backend']}), bf16 compute with fp32 master weights and AdamW state, gradient checkpointing, "
        f"packed micro-batches of at most {w['micro_batch_tokens']:,} tokens; a batch of {w['rows']} rows "
        f"({w['long_rows']} near the budget, the rest {w['short'][0]}-{w['short'][1]} tokens); "
        f"one warm-up step, then up to {result['steps']} timed steps. Random weights in the models' shapes.",
        "",
        *table(result["rows"]),
        "",
        "tokens/s: the batch's tokens over the median step. Model TFLOP/s = 6 N tokens/s with N the "
        "parameters a token multiplies by (decoder layers and output head); MFU divides it by the peak. "
        "6 N leaves out attention and the checkpointed recompute, and over-counts LoRA (no weight "
        "gradient for the frozen base: about 4 N). Peak allocated / reserved: torch.cuda over the timed "
        "steps. Computed: benchmarks.trainer_sizing's bytes for fsdp2 on 1 rank, bf16, checkpointing, "
        f"{w['micro_batch_tokens']:,} tokens per micro-batch (docs/trainer-sizing.md is that module's page; "
        "it holds no CUDA context, allocator slack or NCCL buffers).",
    ]
    return "\n".join(lines) + "\n"


def library_versions() -> dict[str, str | None]:
    """torch (and its CUDA), transformers and peft: what a bare GPU node happens to have."""
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="the reduced CPU mode (the default without CUDA)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=[m for m, _, _ in MODELS],
        default=[m for m, _, _ in MODELS],
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps per model, at most (default 5; 2 in the CPU mode)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="seconds for all models together (default 420: the run stays under 8 minutes)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak"
    )
    parser.add_argument(
        "--tmp-dir", default=None, help="where the random checkpoints are written"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--deadline", type=float, default=math.inf, help=argparse.SUPPRESS
    )
    add_output_args(parser, name_default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        args.cpu = True
    if args.steps is None:
        args.steps = 2 if args.cpu else 5
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.child is not None:
        run_model(args)
        return 0
    gpu = None if args.cpu else torch.cuda.get_device_name(0)
    peak = args.peak_tflops or peak_tflops(gpu)
    out = ResultFiles.claim(
        args.name or f"gpu_trainer_{device_slug(gpu)}",
        [".json", ".md"],
        overwrite=args.overwrite,
    )
    models = [m for m in MODELS if m[0] in args.models]
    started = time.time()
    rows = [summarise(r, peak) for r in run_models(args, models)]
    workload = Workload.for_mode(args.cpu)
    result = {
        "mode": "cpu (reduced)" if args.cpu else "gpu",
        "versions": library_versions(),
        "peak_bf16_tflops": peak,
        "backend": "gloo" if args.cpu else "cpu:gloo,cuda:nccl",
        "steps": args.steps,
        "budget_s": args.budget_s,
        "wall_s": time.time() - started,
        "workload": dataclasses.asdict(workload),
        "rows": rows,
    }
    path = out.write_json(result)
    markdown = to_markdown(json.loads(path.read_text()))
    out.write_text(".md", markdown)
    print("\n".join(table(rows)))
    print(f"wrote {path} and {path.with_suffix('.md')} in {result['wall_s']:.0f} s")
    failed = [r["model"] for r in rows if "step_s_median" not in r]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
