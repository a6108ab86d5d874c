"""GRPOTrainer.train_step time on a batch of skewed lengths: padded micro-batches vs token-budget packed ones.

One batch (``--rows`` trajectories, most ``--short`` tokens long, ``--long-rows`` of them near
``--max-len``, in random order) is trained on the offline tiny model (float32, CPU unless CUDA is
there) by two trainers built from the same weights:

* ``padded``: ``trainer.micro_batch_size=--micro-batch-size`` consecutive rows per pass, each pass
  padded to its longest row (the default path);
* ``packed``: ``trainer.max_tokens_per_micro_batch`` = the budget (default: 8 x the mean length, at
  least the longest row), rows grouped by first-fit decreasing and each group run as one packed
  sequence without padding (``roll_async.trainer.micro_batches``).

Before every timed step both trainers get the initial weights and a fresh AdamW state back, so every
repeat is the same step; the two run alternately (ABAB, order flipped every repeat) after one untimed
warm-up each, on ``--threads`` torch threads (1 by default: on a shared machine, threads beyond the free
cores make wall times swing by several x). The result gives each path's median [min, max] wall and
process-CPU seconds, the speed ratios padded / packed,
the token positions each computes, and each path's loss (they must agree within 1e-5).

    python -m benchmarks.trainer_packing                    # 32 rows, 7 repeats -> trainer_packing_cpu.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

from benchmarks.common import ResultFiles, add_output_args, device_kind, spread

LOSS_TOLERANCE = 1e-5


def make_batch(args: argparse.Namespace, vocab: int) -> Any:
    from roll_async.trainer.collate import collate_trajectories
    from roll_async.trajectory import Trajectory

    rng = random.Random(args.seed)
    lengths = [rng.randint(args.short[0], args.short[1]) for _ in range(args.rows)]
    for row in rng.sample(range(args.rows), args.long_rows):
        lengths[row] = rng.randint(int(args.max_len * 0.875), args.max_len)
    trajectories = []
    for i, n in enumerate(lengths):
        prompt = min(args.prompt_len, n - 1)
        mask = [0] * prompt + [1] * (n - prompt)
        trajectories.append(
            Trajectory(
                tag="bench",
                group_id=i // args.group_size,
                episode_id=i,
                env_id=i,
                seed=args.seed,
                traj_id=f"bench-{i}",
                created_step=0,
                token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                response_mask=mask,
                logprobs=[-rng.uniform(0.5, 7.0) if m else 0.0 for m in mask],
                episode_reward=float(rng.random() < 0.5),
            )
        )
    return collate_trajectories(trajectories, pad_token_id=0)


def computed_positions(trainer: Any, batch: Any) -> int:
    """Token positions the model runs over for one pass of the batch: rows x width padded, the tokens packed."""
    total = 0
    for mb in trainer.plan(batch):
        widths = [int(batch.attention_mask[r].sum()) for r in mb.rows]
        total += sum(widths) if trainer.packing else len(widths) * max(widths)
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from roll_async.config.schema import TrainerConfig
    from roll_async.model.tiny import build_tiny_model
    from roll_async.trainer import GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = build_tiny_model()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = dict(device=device, lr=1e-5, max_grad_norm=1.0)
    padded = GRPOTrainer(
        TrainerConfig(**base, micro_batch_size=args.micro_batch_size), model_path
    )
    batch = make_batch(args, padded.model.config.vocab_size)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    mean_len = sum(lengths) / len(lengths)
    budget = args.budget or max(int(round(8 * mean_len)), max(lengths))
    packed = GRPOTrainer(
        TrainerConfig(**base, max_tokens_per_micro_batch=budget), model_path
    )
    assert packed.packing, "the tiny model should support packing"
    trainers = {"padded": padded, "packed": packed}
    initial = {
        name: t.detach().clone() for name, t in padded.model.state_dict().items()
    }

    def timed_step(trainer: GRPOTrainer) -> tuple[float, float, float]:
        """(wall seconds, process CPU seconds, loss) of one train step from the initial weights."""
        trainer.model.load_state_dict(initial)
        trainer.optimizer.state.clear()
        if device == "cuda":
            torch.cuda.synchronize()
        started, cpu_started = time.perf_counter(), time.process_time()
        metrics = trainer.train_step(batch, step=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return (
            time.perf_counter() - started,
            time.process_time() - cpu_started,
            metrics["train/loss"],
        )

    for trainer in trainers.values():
        timed_step(trainer)  # warm-up: first-call allocations and lazy imports
    times: dict[str, list[float]] = {name: [] for name in trainers}
    cpu_times: dict[str, list[float]] = {name: [] for name in trainers}
    losses: dict[str, list[float]] = {name: [] for name in trainers}
    load_before = os.getloadavg()[0]
    for i in range(args.repeats):
        order = ["padded", "packed"] if i % 2 == 0 else ["packed", "padded"]
        for name in order:
            seconds, cpu_seconds, loss = timed_step(trainers[name])
            times[name].append(seconds)
            cpu_times[name].append(cpu_seconds)
            losses[name].append(loss)
        print(
            f"repeat {i + 1}/{args.repeats}: padded {times['padded'][-1]:.3f}s "
            f"(CPU {cpu_times['padded'][-1]:.3f}s), packed {times['packed'][-1]:.3f}s "
            f"(CPU {cpu_times['packed'][-1]:.3f}s)",
            flush=True,
        )
    loss_diff = max(
        abs(a - b) for a, b in zip(losses["padded"], losses["packed"], strict=True)
    )
    result = {
        "model": "tiny-qwen2 (offline, float32)",
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "rows": args.rows,
        "lengths": lengths,
        "mean_length": mean_len,
        "longest": max(lengths),
        "micro_batch_size": args.micro_batch_size,
        "max_tokens_per_micro_batch": budget,
        "micro_batches": {name: len(t.plan(batch)) for name, t in trainers.items()},
        "computed_positions": {
            name: computed_positions(t, batch) for name, t in trainers.items()
        },
        "real_tokens": int(sum(lengths)),
        "repeats": args.repeats,
        "seconds": {name: spread(values) for name, values in times.items()},
        "cpu_seconds": {name: spread(values) for name, values in cpu_times.items()},
        "speedup_padded_over_packed": statistics.median(times["padded"])
        / statistics.median(times["packed"]),
        "cpu_ratio_padded_over_packed": statistics.median(cpu_times["padded"])
        / statistics.median(cpu_times["packed"]),
        "loss": {name: values[0] for name, values in losses.items()},
        "loss_max_abs_diff": loss_diff,
        "loss_equal_within": LOSS_TOLERANCE,
        "loss_equal": loss_diff <= LOSS_TOLERANCE,
        "load1_before": round(load_before, 2),
        "load1_after": round(os.getloadavg()[0], 2),
    }
    return result


def to_markdown(result: dict[str, Any]) -> str:
    s = result["seconds"]
    c = result["cpu_seconds"]
    pos = result["computed_positions"]
    lines = [
        "# GRPOTrainer.train_step: padded micro-batches vs token-budget packed",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}  ",
        f"Model: {result['model']} on {result['device']} (torch threads: {result['torch_threads']}). One batch of "
        f"{result['rows']} rows, mean length {result['mean_length']:.0f}, longest {result['longest']}; "
        f"load average {result['load1_before']} before, {result['load1_after']} after.  ",
        f"Median [min, max] of {result['repeats']} train steps each, run alternately, every step from the same "
        "weights and a fresh AdamW state.",
        "",
        "| path | micro-batches | token positions computed | train_step wall s | train_step CPU s | loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, label in (
        ("padded", f"padded (`micro_batch_size={result['micro_batch_size']}`)"),
        (
            "packed",
            f"packed (`max_tokens_per_micro_batch={result['max_tokens_per_micro_batch']}`)",
        ),
    ):
        lines.append(
            f"| {label} | {result['micro_batches'][name]} | {pos[name]:,} | {s[name]['median']:.3f} "
            f"[{s[name]['min']:.3f}, {s[name]['max']:.3f}] | {c[name]['median']:.3f} "
            f"[{c[name]['min']:.3f}, {c[name]['max']:.3f}] | {result['loss'][name]:.7f} |"
        )
    lines += [
        "",
        f"Speed ratio padded / packed: **{result['speedup_padded_over_packed']:.2f}x** wall, "
        f"**{result['cpu_ratio_padded_over_packed']:.2f}x** CPU time. "
        f"Real tokens: {result['real_tokens']:,}. Largest loss difference over the repeats: "
        f"{result['loss_max_abs_diff']:.2e} ({'within' if result['loss_equal'] else 'NOT within'} "
        f"{result['loss_equal_within']:g}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--long-rows", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument(
        "--short",
        type=int,
        nargs=2,
        default=[32, 96],
        metavar=("MIN", "MAX"),
        help="length range of the short rows",
    )
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument(
        "--budget",
        type=int,
        default=0,
        help="max_tokens_per_micro_batch (default: 8 x mean length, at least the longest row)",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared machine more threads than free cores make "
        "wall times swing by several x; 0 keeps torch's default)",
    )
    add_output_args(parser, name_default=f"trainer_packing_{device_kind()}")
    args = parser.parse_args(argv)
    if args.long_rows > args.rows:
        parser.error("--long-rows must not exceed --rows")
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    result = run(args)
    path = out.write_json(result)
    out.write_text(".md", to_markdown(json.loads(path.read_text())))
    print(
        f"padded {result['seconds']['padded']['median']:.3f}s, packed {result['seconds']['packed']['median']:.3f}s "
        f"({result['speedup_padded_over_packed']:.2f}x wall, {result['cpu_ratio_padded_over_packed']:.2f}x CPU); "
        f"losses equal: {result['loss_equal']}"
    )
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0 if result["loss_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
