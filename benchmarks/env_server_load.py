"""Load test of the env server: concurrent sessions held, requests/s, latency percentiles, errors.

Starts ``roll-async env-server`` on loopback (a subprocess), opens ``--sessions``
env instances at once through the real client (``RemoteEnv``, one aiohttp
connection pool), and has each session play countdown episodes (reset, then
steps until the episode ends) back to back for ``--duration-s`` seconds.
Bounded in count and time: at most ``--sessions`` instances, each run stops at
its deadline, and ``--max-requests`` caps the total. Every request's latency is
recorded client side; the result is the median over ``--repeats`` runs, with
the spread (min, max).

    python -m benchmarks.env_server_load --isolation none --sessions 256 --duration-s 15 --repeats 3
    python -m benchmarks.env_server_load --isolation process --sessions 32 --duration-s 15 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from benchmarks.common import ResultFiles, add_output_args, spread
from roll_async.metrics import percentile

WRONG_ANSWER = "<answer>1 + 1</answer>"  # well formed, (almost always) not the target: episodes run to max_steps


async def one_run(
    url: str, sessions: int, duration_s: float, max_requests: int
) -> dict[str, Any]:
    from roll_async.env_service.client import EnvServiceClient, RemoteEnv

    latencies: list[float] = []
    errors: dict[str, int] = {}
    budget = [max_requests]

    async def timed(call) -> Any:
        budget[0] -= 1
        started = time.perf_counter()
        try:
            return await call
        except Exception as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return None
        finally:
            latencies.append(time.perf_counter() - started)

    envs = [
        RemoteEnv(url, "countdown", {"max_steps": 3}, call_timeout_s=30, max_retries=1)
        for _ in range(sessions)
    ]
    opened = await asyncio.gather(*(timed(env.prepare()) for env in envs))
    held = sum(env.env_id is not None for env in envs)
    _ = opened
    deadline = time.perf_counter() + duration_s
    started = time.perf_counter()
    episodes = [0]

    async def session(env: Any, index: int) -> None:
        seed = index * 100_000
        while (
            time.perf_counter() < deadline and budget[0] > 0 and env.env_id is not None
        ):
            seed += 1
            if await timed(env.reset(seed)) is None:
                return
            done = False
            while not done and time.perf_counter() < deadline and budget[0] > 0:
                result = await timed(env.step(WRONG_ANSWER))
                if result is None:
                    return
                done = result[2] or result[3]
            episodes[0] += 1

    await asyncio.gather(*(session(env, i) for i, env in enumerate(envs)))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(env.close() for env in envs), return_exceptions=True)
    await EnvServiceClient.shared(url, max_retries=1).close()
    # the prepare calls are not part of the timed window
    requests = len(latencies) - sessions
    return {
        "sessions_held": held,
        "requests": requests,
        "episodes": episodes[0],
        "seconds": elapsed,
        "requests_per_s": requests / elapsed if elapsed > 0 else 0.0,
        "latency_p50_ms": 1000 * percentile(latencies, 50),
        "latency_p99_ms": 1000 * percentile(latencies, 99),
        "latency_max_ms": 1000 * max(latencies, default=0.0),
        "errors": sum(errors.values()),
        "error_kinds": errors,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (
        "sessions_held",
        "requests_per_s",
        "latency_p50_ms",
        "latency_p99_ms",
        "errors",
        "requests",
        "episodes",
    ):
        out[key] = spread([r[key] for r in runs])
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from roll_async.env_service.server import launch_server_process

    process, url = launch_server_process(
        "--isolation",
        args.isolation,
        "--max-envs",
        str(args.sessions + 8),
        "--threads",
        str(args.threads),
    )
    try:
        runs = []
        for repeat in range(args.repeats):
            result = await one_run(
                url, args.sessions, args.duration_s, args.max_requests
            )
            print(f"run {repeat}: {result}", flush=True)
            runs.append(result)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {
        "isolation": args.isolation,
        "sessions": args.sessions,
        "duration_s": args.duration_s,
        "load_average_at_start": args.load_at_start,
        "runs": runs,
        "summary": summarize(runs),
    }


def to_markdown(payload: dict[str, Any]) -> str:
    s = payload["summary"]
    fmt = lambda d, p=0: f"{d['median']:.{p}f} ({d['min']:.{p}f}-{d['max']:.{p}f})"  # noqa: E731
    return "\n".join(
        [
            f"# Env server load test ({payload['isolation']} isolation, {payload['sessions']} sessions)",
            "",
            f"Command: `{payload['command']}`  ",
            f"Machine: {payload['machine']['cpu_model']}, {payload['machine']['cpu_count']} cores, "
            f"{payload['machine'].get('memory_gib')} GiB; load average at start {payload['load_average_at_start']} "
            "(shared with other work: figures are lower bounds).  ",
            f"Recorded {payload['recorded_at']}; loopback only; median over {len(payload['runs'])} runs (min-max).",
            "",
            "| sessions held | requests/s | p50 latency ms | p99 latency ms | errors | requests | episodes |",
            "|---|---|---|---|---|---|---|",
            f"| {fmt(s['sessions_held'])} | {fmt(s['requests_per_s'], 1)} | {fmt(s['latency_p50_ms'], 1)} | "
            f"{fmt(s['latency_p99_ms'], 1)} | {fmt(s['errors'])} | {fmt(s['requests'])} | {fmt(s['episodes'])} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isolation", choices=("none", "process"), default="none")
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=16, help="server threads for --isolation none"
    )
    add_output_args(parser, name_default=None)
    args = parser.parse_args(argv)
    out = ResultFiles.claim(
        args.name or f"env_server_load_{args.isolation}",
        [".json", ".md"],
        overwrite=args.overwrite,
    )
    args.load_at_start = [round(x, 2) for x in os.getloadavg()]
    payload = asyncio.run(run(args))
    path = out.write_json(payload)
    md = to_markdown({**payload, **__import__("json").loads(path.read_text())})
    out.write_text(".md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
