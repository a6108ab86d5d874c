"""Weight-sync TRANSPORT time against parameter count: per-replica pickled copies vs buckets put once.

For each model size (float32 state dicts of random tensors, 4M-parameter matrices plus
a remainder) and ``--replicas`` Ray actors standing in for engine replicas, on one
machine (CPU):

* ``per_replica_copy`` (the old path): ``actor.update.remote(state_dict)`` for every
  replica; Ray serializes the dict once per call and each replica packs it to
  safetensors bytes itself (as ``VLLMEngine.update_weights`` did) and parses them.
* ``buckets_put_once`` (the new path, ``roll_async.engine.weight_transport``): the
  driver packs safetensors buckets once, ``ray.put``s each once, and every replica
  fetches the same refs and parses them.

Both end with the replica holding the parsed tensors; the vLLM reload itself (the
same for both paths; ~50 ms for the tiny model, see /work/shared/vllm-cpu-facts.md)
is not included: this measures the transport, which is what changed.

    python -m benchmarks.weight_sync                     # 1M, 10M, 50M, 100M parameters, 2 replicas, 3 runs each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common import ResultFiles, add_output_args


class ReplicaStandIn:
    """Receives weights as an engine replica would (Ray actor)."""

    async def update_from_dict(self, weights: dict) -> int:
        from safetensors.torch import load, save

        payload = save(
            {k: v.contiguous() for k, v in weights.items()}
        )  # what the old update_weights did per replica
        return len(load(payload))

    async def update_from_buckets(self, buckets: list) -> int:
        from safetensors.torch import load

        from roll_async.engine.weight_transport import resolve_bucket

        count = 0
        for bucket in buckets:
            count += len(load(bytes(await resolve_bucket(bucket))))
        return count


def state_dict(num_params: int) -> dict:
    import torch

    weights, left, i = {}, num_params, 0
    while left > 0:
        n = min(left, 2048 * 2048)
        weights[f"layer{i}.weight"] = torch.randn(
            n // 2048 or 1, 2048 if n >= 2048 else n
        )
        left -= weights[f"layer{i}.weight"].numel()
        i += 1
    return weights


async def measure(actors: list, weights: dict, path: str, bucket_bytes: int) -> float:
    from roll_async.engine.weight_transport import pack_weight_buckets, put_buckets

    started = time.perf_counter()
    if path == "per_replica_copy":
        await asyncio.gather(*(a.update_from_dict.remote(weights) for a in actors))
    else:
        refs = put_buckets(pack_weight_buckets(weights, bucket_bytes))
        await asyncio.gather(*(a.update_from_buckets.remote(refs) for a in actors))
        del refs
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from roll_async.runtime.ray_utils import init_ray

    init_ray(None, None)
    actors = [
        ray.remote(ReplicaStandIn).options(num_cpus=0).remote()
        for _ in range(args.replicas)
    ]
    # started and imported
    await asyncio.gather(*(a.update_from_buckets.remote([]) for a in actors))
    rows = []
    try:
        for millions in args.params_m:
            weights = state_dict(int(millions * 1e6))
            n = sum(t.numel() for t in weights.values())
            times: dict[str, list[float]] = {
                "per_replica_copy": [],
                "buckets_put_once": [],
            }
            for i in range(args.repeats):
                order = (
                    ["per_replica_copy", "buckets_put_once"]
                    if i % 2 == 0
                    else ["buckets_put_once", "per_replica_copy"]
                )
                for path in order:
                    times[path].append(
                        await measure(actors, weights, path, args.bucket_mb << 20)
                    )
            row = {
                "params": n,
                "bytes": 4 * n,
                "replicas": args.replicas,
                "load1": round(os.getloadavg()[0], 2),
            }
            for path, values in times.items():
                row[f"{path}_s_median"] = statistics.median(values)
                row[f"{path}_s_min"] = min(values)
                row[f"{path}_s_max"] = max(values)
            row["speedup"] = (
                row["per_replica_copy_s_median"] / row["buckets_put_once_s_median"]
            )
            rows.append(row)
            print(
                f"{n / 1e6:6.1f}M params: per-replica copy {row['per_replica_copy_s_median']:.3f}s, "
                f"buckets put once {row['buckets_put_once_s_median']:.3f}s ({row['speedup']:.2f}x)",
                flush=True,
            )
            del weights
    finally:
        for a in actors:
            ray.kill(a)
        ray.shutdown()
    return {
        "transport_only": True,
        "bucket_mb": args.bucket_mb,
        "repeats": args.repeats,
        "rows": rows,
    }


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Weight-sync transport time vs parameter count (CPU, float32)",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}  ",
        f"Machine: {result['machine']}  ",
        f"Transport only (pack, object store, delivery and parsing on {result['rows'][0]['replicas'] if result['rows'] else '?'} "
        f"replica stand-in actors); the vLLM reload is not included. Bucket size {result['bucket_mb']} MiB; "
        f"median of {result['repeats']} runs each, alternating order, [min, max].",
        "",
        "| parameters | MB | per-replica pickled copy s | buckets put once s | speedup | load |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['params'] / 1e6:.1f}M | {r['bytes'] / 1e6:.0f} | {r['per_replica_copy_s_median']:.3f} "
            f"[{r['per_replica_copy_s_min']:.3f}, {r['per_replica_copy_s_max']:.3f}] | {r['buckets_put_once_s_median']:.3f} "
            f"[{r['buckets_put_once_s_min']:.3f}, {r['buckets_put_once_s_max']:.3f}] | {r['speedup']:.2f}x | {r['load1']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params-m", type=float, nargs="+", default=[1, 10, 50, 100])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=int, default=256)
    add_output_args(parser, name_default="weight_sync_cpu")
    args = parser.parse_args(argv)
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    result = asyncio.run(main_async(args))
    path = out.write_json(result)
    out.write_text(".md", to_markdown(json.loads(path.read_text())))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
