"""The trainer side: tokens/s and memory per rank at 1 and 2 fsdp2 ranks, packed vs padded, weight-gather time vs model size.

Four sections, each run by this one command, written to one result:

* ``ranks``: ``GRPOTrainer.train_step`` on one batch (``--rows`` rows of skewed lengths,
  benchmarks.trainer_packing's generator) with ``trainer.strategy=single`` in this process and
  ``fsdp2`` on 1 and 2 gloo CPU ranks (plain processes, ``roll_async.testing.spawned_ranks``; each
  rank and the single trainer on one torch thread). Per setting: tokens/s (the batch's tokens over
  the step's median wall time) and, per rank, the parameter and AdamW-state bytes it holds and its
  process's peak RSS.
* ``init``: host memory a process gains while it builds its trainer (policy and KL reference) for the
  largest sync model saved in bfloat16 (as published checkpoints are), in a fresh process per setting: ``single``; ``fsdp2`` at 2 ranks as built now
  (empty on every rank, the main rank reads the checkpoint and sends each rank its shards); and, side
  by side, the earlier fsdp2 build, where every rank read the whole checkpoint and then sharded it.
* ``packing``: benchmarks.trainer_packing (padded vs token-budget packed micro-batches, same loss).
* ``sync``: the trainer side of a weight sync for models of growing size (random-init Qwen2
  architectures): the weights gathered under checkpoint names and packed into the engines'
  safetensors buckets, ``single`` (one state dict) vs ``fsdp2`` at 2 ranks (one decoder layer at a
  time, the main rank packing). The object-store put and the engine's reload are the same for both
  and are measured by benchmarks.weight_sync.

Settings run alternately where they share a process, medians of ``--repeats`` with min and max.

    python -m benchmarks.trainer                    # all sections -> trainer_cpu.{json,md}
    python -m benchmarks.trainer --sections ranks sync --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import trainer_packing
from benchmarks.common import (
    ResultFiles,
    add_output_args,
    device_kind,
    peak_rss_bytes,
    spread,
)

SECTIONS = ("ranks", "init", "packing", "sync")
#: (hidden_size, num_hidden_layers, intermediate_size) of the random models the sync section gathers.
SYNC_SIZES = ((256, 4, 1024), (512, 4, 2048), (1024, 4, 4096), (1024, 12, 4096))


def build_random_model(
    directory: Path,
    hidden: int,
    layers: int,
    intermediate: int,
    saved_dtype: str = "float32",
) -> str:
    """A random-init Qwen2 model directory with the tiny model's tokenizer (no download).

    ``saved_dtype="bfloat16"`` stores it as published checkpoints are, so a
    float32 trainer converts (and allocates) every weight it reads.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from roll_async.model.tiny import build_tiny_model

    tiny = build_tiny_model()
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 128, 1),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, saved_dtype))
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(directory)
    return str(directory)


def _batch(rows: int, vocab: int) -> Any:
    args = argparse.Namespace(
        rows=rows,
        long_rows=max(rows // 8, 1),
        max_len=512,
        short=[32, 96],
        prompt_len=24,
        group_size=4,
        seed=0,
    )
    return trainer_packing.make_batch(args, vocab)


def _timed_steps(
    info: Any, model_path: str, batch: Any, repeats: int, config: Any
) -> dict[str, Any]:
    """Warm-up step, then ``repeats`` timed train steps; this process's bytes and peak RSS."""
    import torch

    from roll_async.trainer.grpo_trainer import GRPOTrainer

    torch.set_num_threads(1)
    trainer = GRPOTrainer(config, model_path, rank=info)
    trainer.train_step(batch, 0)
    seconds = []
    for step in range(1, repeats + 1):
        started = time.perf_counter()
        trainer.train_step(batch, step)
        seconds.append(time.perf_counter() - started)
    return {
        "seconds": seconds,
        **trainer.memory(),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def ranks_section(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    from roll_async.config.schema import TrainerConfig
    from roll_async.testing.spawned_ranks import run_on_ranks

    with tempfile.TemporaryDirectory() as tmp:
        path = build_random_model(Path(tmp), *SYNC_SIZES[1])
        batch = _batch(args.rows, 1024)
        tokens = int(batch.attention_mask.sum())
        single = TrainerConfig(device="cpu", lr=1e-5, micro_batch_size=4)
        settings = {
            "single": lambda: [_timed_steps(None, path, batch, args.repeats, single)],
            "fsdp2 x1": lambda: run_on_ranks(
                _timed_steps,
                1,
                path,
                batch,
                args.repeats,
                dataclasses.replace(single, strategy="fsdp2", num_ranks=1),
            ),
            "fsdp2 x2": lambda: run_on_ranks(
                _timed_steps,
                2,
                path,
                batch,
                args.repeats,
                dataclasses.replace(single, strategy="fsdp2", num_ranks=2),
            ),
        }
        out: dict[str, Any] = {
            "model": f"random Qwen2, hidden {SYNC_SIZES[1][0]}, {SYNC_SIZES[1][1]} layers",
            "batch_tokens": tokens,
        }
        for name, run in settings.items():
            ranks = run()
            step = statistics.median(ranks[0]["seconds"])
            out[name] = {
                "step_seconds": spread(ranks[0]["seconds"]),
                "tokens_per_s": tokens / step,
                "per_rank": [
                    {
                        k: r[k]
                        for k in (
                            "parameter_bytes",
                            "optimizer_bytes",
                            "peak_rss_bytes",
                        )
                    }
                    for r in ranks
                ],
            }
            print(f"ranks: {name}: {tokens / step:,.0f} tokens/s", flush=True)
    out["speedup_2_over_1_ranks"] = (
        out["fsdp2 x2"]["tokens_per_s"] / out["fsdp2 x1"]["tokens_per_s"]
    )
    return out


def _init_growth(
    info: Any, model_path: str, config: Any, every_rank_reads: bool
) -> int:
    """Peak host bytes this process gained while it built a trainer's policy and KL reference."""
    import torch

    from roll_async.trainer.grpo_trainer import GRPOTrainer
    from roll_async.trainer.model_loading import load_causal_lm
    from roll_async.trainer.parallel.sharding import shard_model

    torch.set_num_threads(1)
    before = peak_rss_bytes(reset=True)
    if (
        every_rank_reads
    ):  # the earlier fsdp2 build: each rank reads the whole model, then shards it
        models = [
            load_causal_lm(model_path, torch.float32, torch.device("cpu"))
            for _ in range(2)
        ]
        for model in models:
            shard_model(model, info, torch.float32, torch.float32)
    else:
        rank = info if config.strategy == "fsdp2" else None
        models = [GRPOTrainer(config, model_path, rank=rank)]
    grown = peak_rss_bytes() - before
    del models
    return grown


def init_section(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    from roll_async.config.schema import TrainerConfig
    from roll_async.testing.spawned_ranks import run_on_ranks

    single = TrainerConfig(device="cpu", kl_coef=0.05)
    sharded = dataclasses.replace(single, strategy="fsdp2", num_ranks=2)
    settings = {
        "single": (1, single, False),
        "fsdp2 x2, every rank reads": (2, sharded, True),
        "fsdp2 x2": (2, sharded, False),
    }
    runs: dict[str, list[list[int]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_random_model(Path(tmp), *SYNC_SIZES[-1], saved_dtype="bfloat16")
        for _ in range(args.repeats):  # settings alternate, each in fresh processes
            for name, (ranks, config, every_rank_reads) in settings.items():
                runs[name].append(
                    run_on_ranks(_init_growth, ranks, path, config, every_rank_reads)
                )
    hidden, layers, _ = SYNC_SIZES[-1]
    out: dict[str, Any] = {
        "model": f"random Qwen2, hidden {hidden}, {layers} layers, saved in bfloat16"
    }
    for name, samples in runs.items():
        out[name] = [spread([s[r] for s in samples]) for r in range(len(samples[0]))]
        print(f"init: {name} done", flush=True)
    return out


def _gather_and_pack(
    info: Any, model_path: str, repeats: int, config: Any
) -> dict[str, Any]:
    import torch

    from roll_async.engine.weight_transport import iter_weight_buckets
    from roll_async.trainer.grpo_trainer import GRPOTrainer

    torch.set_num_threads(1)
    trainer = GRPOTrainer(config, model_path, rank=info)
    seconds, nbytes = [], 0
    for _ in range(repeats + 1):
        started = time.perf_counter()
        # the buckets exactly as a sync packs them (TrainerRank.engine_weight_refs), without the put
        named = (
            item for chunk in trainer.engine_weight_chunks() for item in chunk.items()
        )
        nbytes = sum(len(bucket) for bucket in iter_weight_buckets(named))
        seconds.append(time.perf_counter() - started)
    params = sum(p.numel() for p in trainer.model.parameters())
    if info is not None:
        params *= info.world_size  # each rank counts its own shards
    return {"seconds": seconds[1:], "bucket_bytes": nbytes, "parameters": params}


def sync_section(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    from roll_async.config.schema import TrainerConfig
    from roll_async.testing.spawned_ranks import run_on_ranks

    rows = []
    config = TrainerConfig(device="cpu")
    for size in SYNC_SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            path = build_random_model(Path(tmp), *size)
            single = _gather_and_pack(None, path, args.repeats, config)
            sharded = run_on_ranks(
                _gather_and_pack,
                2,
                path,
                args.repeats,
                dataclasses.replace(config, strategy="fsdp2", num_ranks=2),
            )[0]
        rows.append(
            {
                "hidden_size": size[0],
                "layers": size[1],
                "parameters": single["parameters"],
                "bucket_bytes": single["bucket_bytes"],
                "single_seconds": spread(single["seconds"]),
                "fsdp2_2_ranks_seconds": spread(sharded["seconds"]),
            }
        )
        print(f"sync: {single['parameters'] / 1e6:.1f}M parameters done", flush=True)
    return {"rows": rows}


def packing_section(args: argparse.Namespace) -> dict[str, Any]:
    parser_args = argparse.Namespace(
        rows=32,
        long_rows=4,
        max_len=512,
        short=[32, 96],
        prompt_len=24,
        group_size=4,
        micro_batch_size=8,
        budget=0,
        repeats=args.repeats,
        seed=0,
        threads=1,
    )
    return trainer_packing.run(parser_args)


def to_markdown(result: dict[str, Any]) -> str:
    mib = 1 << 20
    lines = [
        "# Trainer: ranks, packing, weight gather",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}  ",
        "CPU ranks on gloo, one torch thread per rank; nothing here ran on a GPU.",
    ]
    if "ranks" in result:
        r = result["ranks"]
        lines += [
            "",
            f"## Tokens/s and memory per rank ({r['model']}, {r['batch_tokens']:,} tokens per step)",
            "",
            "| setting | step s, median [min, max] | tokens/s | per rank: parameters MiB | AdamW state MiB | peak RSS MiB |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name in ("single", "fsdp2 x1", "fsdp2 x2"):
            s = r[name]
            ranks = s["per_rank"]
            lines.append(
                f"| {name} | {s['step_seconds']['median']:.2f} [{s['step_seconds']['min']:.2f}, "
                f"{s['step_seconds']['max']:.2f}] | {s['tokens_per_s']:,.0f} | "
                + " / ".join(f"{x['parameter_bytes'] / mib:.1f}" for x in ranks)
                + " | "
                + " / ".join(f"{x['optimizer_bytes'] / mib:.1f}" for x in ranks)
                + " | "
                + " / ".join(f"{x['peak_rss_bytes'] / mib:.0f}" for x in ranks)
                + " |"
            )
        lines.append("")
        lines.append(
            f"2 ranks ÷ 1 rank tokens/s: **{r['speedup_2_over_1_ranks']:.2f}×**."
        )
    if "init" in result:
        i = result["init"]
        lines += [
            "",
            f"## Host memory gained while building the trainer ({i['model']}, policy + KL reference)",
            "",
            "| setting | per rank: peak RSS gained MiB, median [min, max] |",
            "|---|---|",
        ]
        for name in ("single", "fsdp2 x2, every rank reads", "fsdp2 x2"):
            lines.append(
                f"| {name} | "
                + " / ".join(
                    f"{x['median'] / mib:.0f} [{x['min'] / mib:.0f}, {x['max'] / mib:.0f}]"
                    for x in i[name]
                )
                + " |"
            )
    if "packing" in result:
        p = result["packing"]
        lines += [
            "",
            "## Packed vs padded micro-batches (tiny model, skewed lengths)",
            "",
            f"padded {p['seconds']['padded']['median']:.3f} s, packed {p['seconds']['packed']['median']:.3f} s "
            f"per train step: **{p['speedup_padded_over_packed']:.2f}×** wall, "
            f"{p['cpu_ratio_padded_over_packed']:.2f}× CPU; largest loss difference {p['loss_max_abs_diff']:.1e}.",
        ]
    if "sync" in result:
        lines += [
            "",
            "## Weight gather + bucket packing vs parameter count (trainer side of a sync)",
            "",
            "| parameters | bucket MiB | single s | fsdp2 at 2 ranks s |",
            "|---:|---:|---:|---:|",
        ]
        for row in result["sync"]["rows"]:
            a, b = row["single_seconds"], row["fsdp2_2_ranks_seconds"]
            lines.append(
                f"| {row['parameters'] / 1e6:.1f}M | {row['bucket_bytes'] / mib:.0f} | "
                f"{a['median']:.3f} [{a['min']:.3f}, {a['max']:.3f}] | {b['median']:.3f} [{b['min']:.3f}, {b['max']:.3f}] |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS)
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=16)
    add_output_args(parser, name_default=f"trainer_{device_kind()}")
    args = parser.parse_args(argv)
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    result: dict[str, Any] = {}
    for section in args.sections:
        result[section] = {
            "ranks": ranks_section,
            "init": init_section,
            "packing": packing_section,
            "sync": sync_section,
        }[section](args)
    path = out.write_json(result)
    out.write_text(".md", to_markdown(json.loads(path.read_text())))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
