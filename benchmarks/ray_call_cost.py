"""Ray call cost: CPU per engine request when it crosses a Ray actor boundary.

Every turn of a per-env rollout is one Ray actor call from an EnvManagerWorker to
the engine actor. On a machine where the rollout side shares cores with vLLM
that CPU slows the engine's steps (benchmarks/env_grouping.py's CPU table), so
this measures it alone: a caller actor sends ``--concurrency`` requests shaped
like the rollout's (a GenerationRequest of ``--prompt-len`` ids; a
GenerationResult of ``--output-len`` ids and logprobs) to an engine-shaped actor
that answers after ``--engine-latency-s``, in rounds, and reports the CPU time
(process time: every thread, Ray's included) per request on each side.

Three ways to send: ``single``, one actor call per request (the rollout's
``engine.request_transport: ray``); ``stream``, all of a round's requests in one
call whose results come back one by one as a Ray streaming generator (a batching
transport one could build); ``zmq``, one message per request over the engine
actor's ZMQ socket (``ZmqEngineClient``, the rollout's default transport).
Modes rotate within each repeat.

    python -m benchmarks.ray_call_cost --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from benchmarks.common import ResultFiles, add_output_args, spread
from roll_async.engine.zmq_engine_client import ServesRequestsOverZmq
from roll_async.trajectory import GenerationRequest, GenerationResult

MODES = ("single", "stream", "zmq")


class EchoEngine(ServesRequestsOverZmq):
    """Answers a GenerationRequest after a fixed delay with a result of ``output_len`` tokens (no model)."""

    def __init__(self, output_len: int, latency_s: float) -> None:
        self.output_len, self.latency_s = output_len, latency_s

    def stats(self) -> dict[str, Any]:
        return {}  # ZmqEngineClient's liveness check

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await asyncio.sleep(self.latency_s)
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=list(range(self.output_len)),
            logprobs=[-0.5] * self.output_len,
            finish_reason="length",
            weight_version=0,
            num_prompt_tokens=len(request.prompt_token_ids),
        )

    async def generate_stream(self, requests: list[GenerationRequest]):
        """Results in completion order, each as soon as it is ready."""
        for next_done in asyncio.as_completed([self.generate(r) for r in requests]):
            yield await next_done

    def cpu_s(self) -> float:
        return time.process_time()


class Caller:
    """Sends rounds of requests to the engine actor and measures both sides' CPU."""

    def __init__(self, engine: Any) -> None:
        import ray

        from roll_async.engine.zmq_engine_client import ZmqEngineClient

        self.engine = engine
        self.zmq_client = ZmqEngineClient(
            engine, node_id=ray.get_runtime_context().get_node_id()
        )

    def cpu_s(self) -> float:
        return time.process_time()

    async def run(
        self, mode: str, concurrency: int, prompt_len: int, rounds: int
    ) -> dict[str, float]:
        requests = [
            GenerationRequest(
                request_id=f"r{i}",
                prompt_token_ids=list(range(prompt_len)),
                max_tokens=32,
            )
            for i in range(concurrency)
        ]
        caller0, engine0, started = (
            time.process_time(),
            await self.engine.cpu_s.remote(),
            time.perf_counter(),
        )
        for _ in range(rounds):
            if mode == "single":
                results = await asyncio.gather(
                    *(self.engine.generate.remote(r) for r in requests)
                )
            elif mode == "zmq":
                results = await asyncio.gather(
                    *(self.zmq_client.generate(r) for r in requests)
                )
            else:
                stream = self.engine.generate_stream.options(
                    num_returns="streaming"
                ).remote(requests)
                results = [await ref async for ref in stream]
            assert len(results) == concurrency
        wall = time.perf_counter() - started
        caller1, engine1 = time.process_time(), await self.engine.cpu_s.remote()
        n = concurrency * rounds
        return {
            "caller_us": (caller1 - caller0) / n * 1e6,
            "engine_us": (engine1 - engine0) / n * 1e6,
            "wall_s": wall,
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from roll_async.runtime.ray_utils import init_ray

    init_ray(None, args.ray_num_cpus)
    engine = (
        ray.remote(EchoEngine)
        .options(max_concurrency=10_000, num_cpus=0)
        .remote(args.output_len, args.engine_latency_s)
    )
    caller = (
        ray.remote(Caller).options(max_concurrency=10_000, num_cpus=0).remote(engine)
    )
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        for mode in MODES:  # warm both processes and open the ZMQ socket
            await caller.run.remote(mode, args.concurrency, args.prompt_len, 2)
        for repeat in range(args.repeats):
            for mode in MODES[repeat % len(MODES) :] + MODES[: repeat % len(MODES)]:
                out = await caller.run.remote(
                    mode, args.concurrency, args.prompt_len, args.rounds
                )
                runs[mode].append(out)
                print(
                    f"{mode} (repeat {repeat + 1}): caller {out['caller_us']:.0f} us, engine {out['engine_us']:.0f} us "
                    f"per request, {out['wall_s']:.2f}s",
                    flush=True,
                )
    finally:
        ray.shutdown()
    rows = []
    for mode in MODES:
        caller_us = [r["caller_us"] for r in runs[mode]]
        engine_us = [r["engine_us"] for r in runs[mode]]
        rows.append(
            {
                "mode": mode,
                "caller_cpu_us_per_request": spread(caller_us),
                "engine_cpu_us_per_request": spread(engine_us),
                "total_cpu_us_per_request": spread(
                    [c + e for c, e in zip(caller_us, engine_us)]
                ),
            }
        )
    return {
        "name": args.name,
        "concurrency": args.concurrency,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "engine_latency_s": args.engine_latency_s,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "rows": rows,
    }


def to_markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [
        f"# Engine request cost by transport ({machine.get('cpu_model')}, {machine.get('cpu_count')} CPUs)",
        "",
        f"Command: `{result['command']}`  ",
        f"Recorded: {result['recorded_at']}; machine: {machine}  ",
        f"{result['concurrency']} requests per round (prompt {result['prompt_len']} ids, result {result['output_len']} ids "
        f"and logprobs, engine latency {result['engine_latency_s']} s), {result['rounds']} rounds per run; "
        f"medians of {result['repeats']} runs with [min, max]. CPU is process time (all threads, Ray's included).",
        "",
        "| mode | caller CPU µs / request | engine-actor CPU µs / request | both |",
        "|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        cells = [
            row[k]
            for k in (
                "caller_cpu_us_per_request",
                "engine_cpu_us_per_request",
                "total_cpu_us_per_request",
            )
        ]
        lines.append(
            f"| {row['mode']} | "
            + " | ".join(
                f"{c['median']:.0f} [{c['min']:.0f}, {c['max']:.0f}]" for c in cells
            )
            + " |"
        )
    lines += [
        "",
        "`single`: one actor call per request (`engine.request_transport: ray`). `stream`: a round's requests "
        "in one call, results back one by one (Ray streaming generator). `zmq`: one message per request over the "
        "engine actor's ZMQ socket (`engine.request_transport: zmq`, roll_async/engine/zmq_engine_client.py).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="requests per round (one worker's envs)",
    )
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--engine-latency-s", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray-num-cpus", type=int, default=None)
    add_output_args(parser, name_default="ray_call_cost_cpu")
    args = parser.parse_args(argv)
    out = ResultFiles.claim(args.name, [".json", ".md"], overwrite=args.overwrite)
    result = asyncio.run(run(args))
    path = out.write_json(result)
    saved = json.loads(path.read_text())
    out.write_text(".md", to_markdown(saved))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    for row in saved["rows"]:
        print(
            f"{row['mode']}: {statistics.median(row['total_cpu_us_per_request']['values']):.0f} us CPU per request (both sides)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
