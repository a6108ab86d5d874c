"""Engine ceiling: generated tokens/s of the bare engine for a sweep of concurrency N.

Every rollout benchmark is measured against this: N concurrent requests of a
fixed prompt length and output length (EOS ignored), driven straight into the
engine with nothing else running. Also reports seconds per decode step, which
the simulated engine of the grouping benchmark is calibrated from.

    python -m benchmarks.engine_ceiling --concurrency 1 4 16 64 --prompt-len 128 --output-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid

from benchmarks.common import ResultFiles, add_output_args, device_kind
from roll_async.config.schema import EngineConfig
from roll_async.engine import VLLMEngine
from roll_async.model.paths import resolve_model_path
from roll_async.trajectory import GenerationRequest


async def measure(
    engine: VLLMEngine, n: int, prompt_len: int, output_len: int, rounds: int
) -> dict[str, float]:
    """Best-of-rounds timing for N concurrent requests whose prompts the prefix cache has never seen.

    Prompts are random ids (from the system's entropy, ids 10-209: known to any model's vocabulary
    here), new for every request of every round and every call: a benchmark that measures the
    ceiling more than once (after each repeat) must not find the last call's prompts cached.
    (Shifted copies of one fixed pattern, used before, repeated across rounds and calls: about half
    of a later round's prompts were prefix-cache hits and skipped their prefill.)
    """
    rng = random.Random()
    timings = []
    for _ in range(rounds):
        requests = [
            GenerationRequest(
                request_id=f"ceiling-{uuid.uuid4().hex[:8]}",
                prompt_token_ids=[rng.randrange(10, 210) for _ in range(prompt_len)],
                max_tokens=output_len,
                temperature=1.0,
                ignore_eos=True,
                seed=i,
            )
            for i in range(n)
        ]
        start = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        elapsed = time.perf_counter() - start
        assert all(len(r.output_token_ids) == output_len for r in results)
        timings.append(elapsed)
    best = min(timings)
    return {
        "concurrency": n,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "seconds_best": best,
        "seconds_median": statistics.median(timings),
        "tokens_per_s": n * output_len / best,
        "decode_step_s": best / output_len,
    }


async def run(args: argparse.Namespace) -> dict:
    model_path = resolve_model_path(args.model)
    config = EngineConfig(
        dtype=args.dtype,
        max_model_len=args.prompt_len + args.output_len + 8,
        max_num_seqs=max(args.concurrency),
        enable_prefix_caching=False,
    )
    engine = VLLMEngine(model_path, config)
    t0 = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - t0
    rows = []
    try:
        for n in args.concurrency:
            row = await measure(
                engine, n, args.prompt_len, args.output_len, args.rounds
            )
            rows.append(row)
            print(
                f"N={n:>4}  {row['tokens_per_s']:>9.1f} tok/s  decode step {row['decode_step_s'] * 1000:.1f} ms",
                flush=True,
            )
    finally:
        await engine.shutdown()
    return {"model": model_path, "engine_startup_s": startup, "rows": rows}


def to_markdown(result: dict) -> str:
    lines = [
        f"# Engine ceiling ({result['machine'].get('gpu') or result['machine']['cpu_model']})",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}",
        "",
        "| N | prompt | output | tokens/s | s per decode step |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['prompt_len']} | {r['output_len']} | {r['tokens_per_s']:.1f} | {r['decode_step_s']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="model dir (default: the offline tiny model)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dtype",
        default="float32",
        help="engine dtype (float32 matches the rollout configs)",
    )
    add_output_args(parser, name_default=None)
    args = parser.parse_args(argv)
    out = ResultFiles.claim(
        args.name or f"engine_ceiling_{device_kind()}",
        [".json", ".md"],
        overwrite=args.overwrite,
    )
    result = asyncio.run(run(args))
    path = out.write_json(result)
    saved = json.loads(path.read_text())
    out.write_text(".md", to_markdown(saved))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
