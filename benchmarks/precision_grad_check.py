"""bf16 against fp32 on the same weights and the same batches: how far apart are the gradients and logprobs?

``precision_curve.py`` compares whole runs, where sampling noise and the order in which envs finish
also differ. This isolates the trainer: it loads the checkpoints of a run that saved its batches
(``logging.save_batches=true``), and for each checkpoint step_N and the batch of step N+1 (the batch
those weights sampled, in sync mode) computes the GRPO gradient (the trainer's own
``accumulate_gradients``, first epoch) and the per-token logprobs once in float32 and once under
``torch.autocast`` bfloat16 (``trainer.param_dtype=bfloat16``), from the same float32 weights. Recorded
per batch: the cosine between the two gradients and the ratio of their norms, the bf16 - fp32 logprob
difference on the scored tokens, and the share of response positions whose argmax token (what greedy
validation decodes) is the same under both, with the fp32 top-1/top-2 logit margin at the positions
where they differ. A reference for the gradient cosine: the same between the batch's two halves in fp32.

    # a run that saved its batches and checkpoints:
    roll-async train configs/default.yaml logging.save_batches=true checkpoint.save_interval=5 \
        checkpoint.keep_last=4 output_dir=RUN_DIR
    python -m benchmarks.precision_grad_check --run-dir RUN_DIR   # each checkpoint step_N with batch N+1
    python -m benchmarks.precision_grad_check --run-dir RUN_DIR --checkpoint RUN_DIR/checkpoints/step_19 --steps 3 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import ResultFiles, add_output_args
from roll_async.config.schema import load_config
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.batch_dump import load_batch, saved_steps
from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trainer.grpo_trainer import GRPOTrainer, _scored_mask
from roll_async.trainer.losses import LossNormalizer


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints/step_N directories, by step."""
    return sorted(
        (run_dir / "checkpoints").glob("step_*"),
        key=lambda p: int(p.name.split("_")[1]),
    )


def _gradient(
    trainer: GRPOTrainer, batch: TrajectoryBatch, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat gradient, per-token logprobs) of the batch's GRPO loss, first epoch, in ``dtype`` compute."""
    cfg = trainer.config
    trainer.compute_dtype = dtype
    advantages = compute_advantages(
        batch.rewards.float(),
        batch.group_index,
        cfg.advantage_estimator,
        normalize_std=cfg.normalize_advantage_std,
    )
    normalizer = LossNormalizer.for_mask(trainer._loss_mask(batch))
    trainer.model.zero_grad(set_to_none=True)
    stats = trainer.accumulate_gradients(batch, advantages, normalizer=normalizer)
    grads = [
        p.grad.detach().flatten()
        if p.grad is not None
        else torch.zeros(p.numel(), dtype=torch.float32)
        for p in trainer.model.parameters()
        if p.requires_grad
    ]
    trainer.model.zero_grad(set_to_none=True)
    return torch.cat(grads).float(), stats.logprobs


@torch.no_grad()
def _argmax_agreement(trainer: GRPOTrainer, batch: TrajectoryBatch) -> dict[str, float]:
    """Share of scored positions whose next-token argmax is the same in fp32 and bf16 compute."""
    scored = _scored_mask(batch.response_mask)[:, 1:]

    def next_token_logits(dtype: torch.dtype) -> torch.Tensor:
        trainer.compute_dtype = dtype
        with trainer._autocast():
            logits = trainer.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            ).logits
        return logits[:, :-1][scored].float()

    out32 = next_token_logits(torch.float32)
    out16 = next_token_logits(torch.bfloat16)
    same = out32.argmax(-1) == out16.argmax(-1)
    top2 = out32.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    return {
        "positions": int(same.numel()),
        "argmax_same": float(same.float().mean()),
        "fp32_margin_where_different_median": float(margin[~same].median())
        if bool((~same).any())
        else float("nan"),
        "fp32_margin_median": float(margin.median()),
        "logit_abs_diff_mean": float((out16 - out32).abs().mean()),
    }


def _subset(batch: TrajectoryBatch, keep: torch.Tensor) -> TrajectoryBatch:
    """The rows ``keep`` (a bool mask) of ``batch``, groups renumbered 0..n-1."""
    rows = keep.nonzero().flatten().tolist()
    tensors = {name: t[keep] for name, t in batch.tensors().items()}
    tensors["group_index"] = torch.unique(tensors["group_index"], return_inverse=True)[
        1
    ]
    lists = {
        name: [getattr(batch, name)[i] for i in rows]
        for name in (
            "tags",
            "group_ids",
            "episode_ids",
            "env_ids",
            "seeds",
            "traj_ids",
            "created_steps",
            "stop_reasons",
        )
        if len(getattr(batch, name)) == len(batch)
    }
    return dataclasses.replace(batch, **tensors, **lists)


def check_batch(trainer: GRPOTrainer, batch: TrajectoryBatch) -> dict[str, Any]:
    g32, lp32 = _gradient(trainer, batch, torch.float32)
    g16, lp16 = _gradient(trainer, batch, torch.bfloat16)
    scored = _scored_mask(batch.response_mask)
    diff = (lp16 - lp32)[scored]
    # the reference: the batch's groups split in two halves
    first = batch.group_index < (int(batch.group_index.max()) + 1) // 2
    ga, _ = _gradient(trainer, _subset(batch, first), torch.float32)
    gb, _ = _gradient(trainer, _subset(batch, ~first), torch.float32)

    def cos(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=dim)

    return {
        "grad_cosine_bf16_fp32": float(cos(g16, g32, dim=0)),
        "grad_norm_fp32": float(g32.norm()),
        "grad_norm_ratio_bf16_fp32": float(g16.norm() / g32.norm()),
        "grad_cosine_half_vs_half_fp32": float(cos(ga, gb, dim=0)),
        "logprob_diff_abs_mean": float(diff.abs().mean()),
        "logprob_diff_abs_max": float(diff.abs().max()),
        "logprob_diff_mean": float(diff.mean()),
        **_argmax_agreement(trainer, batch),
    }


def markdown(payload: dict[str, Any]) -> str:
    rows = payload["batches"]
    lines = [
        "# bf16 vs fp32 on the same weights and batches",
        "",
        f"Recorded {payload['recorded_at']}; command: `{payload['command']}`.",
        "",
        f"Batches saved by the run in `{payload['run_dir']}`, each with the checkpoint whose weights "
        "sampled it (named per row); "
        "gradient of the GRPO loss (first epoch) and logprobs in fp32 and under bf16 autocast from the "
        "same fp32 weights. `half vs half`: cosine of the fp32 gradients of the batch's two halves "
        "(sampling noise, for scale).",
        "",
        "| checkpoint | batch step | 1 - grad cosine bf16/fp32 | grad norm bf16/fp32 | half vs half cosine (fp32) | logprob abs diff mean / max | argmax same | fp32 top-2 margin: median / where argmax differs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for step, r in rows.items():
        lines.append(
            f"| {r['checkpoint']} | {step} | {1 - r['grad_cosine_bf16_fp32']:.1e} | {r['grad_norm_ratio_bf16_fp32']:.4f} | "
            f"{r['grad_cosine_half_vs_half_fp32']:.3f} | {r['logprob_diff_abs_mean']:.4f} / "
            f"{r['logprob_diff_abs_max']:.3f} | {r['argmax_same']:.4f} of {r['positions']} | "
            f"{r['fp32_margin_median']:.3f} / {r['fp32_margin_where_different_median']:.3f} |"
        )
    cosines = [r["grad_cosine_bf16_fp32"] for r in rows.values()]
    lines += [
        "",
        f"Median gradient cosine bf16/fp32: 1 - {1 - statistics.median(cosines):.1e}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--run-dir", required=True, help="a run with logging.save_batches=true"
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="use this checkpoint for the --steps batches (default: each checkpoint step_N with batch N+1)",
    )
    p.add_argument(
        "--steps",
        nargs="*",
        type=int,
        default=None,
        help="batches (default: all saved)",
    )
    add_output_args(p, name_default="precision_grad_check")
    args = p.parse_args(argv)
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    run_dir = Path(args.run_dir)
    config = load_config(run_dir / "config.yaml")
    saved = saved_steps(run_dir)
    if args.checkpoint:
        steps = args.steps if args.steps is not None else sorted(saved)
        pairs = [(Path(args.checkpoint), step) for step in steps]
    else:
        # each checkpoint step_N with the batch of step N+1: the batch those weights sampled (sync mode)
        pairs = [
            (ckpt, int(ckpt.name.split("_")[1]) + 1)
            for ckpt in checkpoints(run_dir)
            if int(ckpt.name.split("_")[1]) + 1 in saved
        ]
        if not pairs:
            raise SystemExit(
                f"{run_dir}: no checkpoint step_N with a saved batch N+1 "
                "(run with logging.save_batches=true checkpoint.save_interval=K)"
            )
    batches: dict[str, dict[str, Any]] = {}
    trainer, loaded = None, None
    for checkpoint, step in pairs:
        if checkpoint != loaded:
            torch.manual_seed(0)
            trainer, loaded = GRPOTrainer(config.trainer, checkpoint), checkpoint
        _, batch = load_batch(saved[step])
        r = {"checkpoint": checkpoint.name, **check_batch(trainer, batch)}
        batches[str(step)] = r
        print(
            f"{checkpoint.name} + batch {step}: 1 - grad cosine {1 - r['grad_cosine_bf16_fp32']:.1e} "
            f"(halves {r['grad_cosine_half_vs_half_fp32']:.3f}), norm ratio {r['grad_norm_ratio_bf16_fp32']:.4f}, "
            f"|dlogp| mean {r['logprob_diff_abs_mean']:.4f} max {r['logprob_diff_abs_max']:.3f}, "
            f"argmax same {r['argmax_same']:.4f}",
            flush=True,
        )
    payload = {
        "run_dir": str(run_dir),
        "batches": batches,
    }
    json_path = out.write_json(payload)
    payload = json.loads(json_path.read_text())
    md = out.write_text(".md", markdown(payload))
    print(f"recorded: {json_path}, {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
