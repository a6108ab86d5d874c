"""Load test of the env server: thousands of concurrent sessions, failures, latency per phase, server memory.

Starts ``roll-async env-server`` on loopback (a fresh subprocess per run) and
drives ``--sessions`` sessions at once through the real client (``RemoteEnv``,
one aiohttp connection pool). Each session creates its env, plays countdown
episodes (reset, then steps until the episode ends) until it has made
``--steps-per-session`` steps, and closes it. Bounded in count and time: at most
``sessions x steps`` steps, every run stops issuing requests at ``--max-seconds``
and every request has a client deadline. It records every request's latency by
phase (create/reset/step/close), failures (any error of a healthy session, and
anything but the expected timeout of a faulty one: must be 0), lost requests
(issued, never answered: must be 0), envs left on the server after the run
(must be 0), and the server's RSS and thread count over time. With
``--faulty-fraction F --fault hang|slow`` every repeat runs twice on fresh
servers: the healthy sessions alone, then the same healthy sessions beside
``F x sessions`` faulty ones (``hang``: every step hangs past ``--fault-timeout-s``,
the server's per-call timeout, and the env is dropped; ``slow``: every step
sleeps ``--slow-s``), and the healthy sessions' latency is compared side by side.
The result is the median over ``--repeats`` runs with the spread (min, max).

    python -m benchmarks.env_server_load --sessions 2000 --steps-per-session 6 --isolation none --name env_server_load_2000
    python -m benchmarks.env_server_load --sessions 2000 --steps-per-session 6 --faulty-fraction 0.05 --fault hang --name env_server_load_2000_hang
    python -m benchmarks.env_server_load --sessions 32 --steps-per-session 12 --isolation process --faulty-fraction 0.125 --fault hang --name env_server_load_process_32_hang
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter
from typing import Any

from benchmarks.common import ResultFiles, add_output_args, spread
from roll_async.env_service.fd_limit import raise_open_files_limit
from roll_async.metrics import percentile

WRONG_ANSWER = "<answer>1 + 1</answer>"  # well formed, (almost always) not the target: episodes run to max_steps
PHASES = ("create", "reset", "step", "close")
FAULTS = ("hang", "slow")
_FAILED = object()


def env_spec(fault: str | None, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(env_type, env_config) of a healthy session (None) or a faulty one."""
    countdown = {"max_steps": 3}
    if fault == "hang":
        return "faulty", {
            "inner_env_type": "countdown",
            "inner_env_config": countdown,
            "fault": "hang",
            "fault_probability": 1.0,
            "hang_s": args.hang_s,
        }
    if fault == "slow":
        return "delayed", {
            "inner_env_type": "countdown",
            "inner_env_config": countdown,
            "step_latency_s": args.slow_s,
        }
    return "countdown", countdown


class Tally:
    """Latencies by (group, phase), failures, expected fault timeouts, requests issued and answered."""

    def __init__(self) -> None:
        self.latencies: dict[tuple[str, str], list[float]] = {}
        self.failures: Counter[str] = Counter()
        self.fault_timeouts = 0
        self.issued = 0
        self.answered = 0

    async def call(self, group: str, phase: str, awaitable: Any) -> Any:
        from roll_async.errors import EnvServiceError

        self.issued += 1
        started = time.perf_counter()
        try:
            return await awaitable
        except EnvServiceError as exc:
            if group == "faulty" and exc.kind == "timeout":
                self.fault_timeouts += 1
            else:
                self.failures[f"{group} {phase}: {exc.kind} ({exc.status})"] += 1
            return _FAILED
        except Exception as exc:
            self.failures[f"{group} {phase}: {type(exc).__name__}"] += 1
            return _FAILED
        finally:
            self.answered += 1
            self.latencies.setdefault((group, phase), []).append(
                time.perf_counter() - started
            )


async def sample_server(
    pid: int, every_s: float, out: list[tuple[float, float, int]]
) -> None:
    """Append (seconds, RSS MiB of the server and its children, server threads) every ``every_s``."""
    import psutil

    server = psutil.Process(pid)
    started = time.perf_counter()
    while True:
        try:
            rss = server.memory_info().rss
            for child in server.children(recursive=True):
                try:
                    rss += child.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            out.append(
                (time.perf_counter() - started, rss / (1 << 20), server.num_threads())
            )
        except psutil.NoSuchProcess:
            return
        await asyncio.sleep(every_s)


async def drive(
    url: str, pid: int, healthy: int, faulty: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One run: ``healthy`` + ``faulty`` sessions at once against the server at ``url``."""
    from roll_async.env_service.client import EnvServiceClient, RemoteEnv

    tally = Tally()
    deadline = time.perf_counter() + args.max_seconds
    completed = Counter()

    async def session(index: int, group: str) -> None:
        env_type, env_config = env_spec(args.fault if group == "faulty" else None, args)
        timeout = args.fault_timeout_s if group == "faulty" else args.call_timeout_s
        env = RemoteEnv(
            url, env_type, env_config, call_timeout_s=timeout, max_retries=1
        )
        steps, seed, attempts = 0, index * 100_000, 0
        while steps < args.steps_per_session and time.perf_counter() < deadline:
            attempts += 1
            if attempts > 4 * args.steps_per_session:
                break  # bounded even if every call fails
            if env.env_id is None:
                if await tally.call(group, "create", env.prepare()) is _FAILED:
                    continue
            seed += 1
            if await tally.call(group, "reset", env.reset(seed)) is _FAILED:
                continue
            done = False
            while (
                not done
                and steps < args.steps_per_session
                and time.perf_counter() < deadline
            ):
                result = await tally.call(group, "step", env.step(WRONG_ANSWER))
                steps += 1
                if result is _FAILED:
                    break
                done = result[2] or result[3]
        if env.env_id is not None:
            await tally.call(group, "close", env.close())
        if steps >= args.steps_per_session:
            completed[group] += 1

    samples: list[tuple[float, float, int]] = []
    sampler = asyncio.create_task(sample_server(pid, args.sample_s, samples))
    await asyncio.sleep(args.sample_s)  # one idle sample first
    groups = ["healthy"] * healthy + ["faulty"] * faulty
    # Interleave the faulty sessions among the healthy ones (every k-th session), as a real fleet would.
    if faulty:
        k = max(1, len(groups) // faulty)
        groups = ["healthy"] * healthy
        for i in range(faulty):
            groups.insert(min(len(groups), i * k), "faulty")
    cpu_at_start = _cpu_seconds(pid)
    started = time.perf_counter()
    tasks = [asyncio.create_task(session(i, g)) for i, g in enumerate(groups)]
    # Every request has a client deadline, so this bound is never reached unless a request is lost.
    grace = max(args.call_timeout_s, args.fault_timeout_s) + 30.0
    done, pending = await asyncio.wait(tasks, timeout=args.max_seconds + grace)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.perf_counter() - started
    server_cpu_s = _cpu_seconds(pid) - cpu_at_start
    client = EnvServiceClient.shared(url, max_retries=1)
    health = await client.health(url)
    await client.close()
    await asyncio.sleep(args.sample_s)
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)

    def pct(group: str, phase: str, q: float) -> float:
        return 1000 * percentile(tally.latencies.get((group, phase), []), q)

    healthy_calls = [
        x for p in ("reset", "step") for x in tally.latencies.get(("healthy", p), [])
    ]
    out: dict[str, Any] = {
        "sessions": healthy + faulty,
        "healthy_sessions": healthy,
        "faulty_sessions": faulty,
        "sessions_completed": completed["healthy"] + completed["faulty"],
        "healthy_sessions_completed": completed["healthy"],
        "requests": tally.issued,
        "answered": tally.answered,
        "lost": tally.issued - tally.answered,
        "failures": sum(tally.failures.values()),
        "failure_kinds": dict(tally.failures),
        "fault_timeouts": tally.fault_timeouts,
        "envs_left_on_server": health.get("envs"),
        "server_stats": health.get("stats"),
        "seconds": elapsed,
        "requests_per_s": tally.issued / elapsed if elapsed > 0 else 0.0,
        "server_cpu_s": server_cpu_s,
        "server_cpu_ms_per_request": 1000 * server_cpu_s / max(1, tally.issued),
        "healthy_p50_ms": 1000 * percentile(healthy_calls, 50),
        "healthy_p99_ms": 1000 * percentile(healthy_calls, 99),
        "server_rss_idle_mib": samples[0][1] if samples else None,
        "server_rss_peak_mib": max((s[1] for s in samples), default=None),
        "server_rss_end_mib": samples[-1][1] if samples else None,
        "server_threads_peak": max((s[2] for s in samples), default=None),
        "server_rss_per_session_kib": (
            1024 * (max(s[1] for s in samples) - samples[0][1]) / (healthy + faulty)
            if samples
            else None
        ),
        "rss_timeline": _thin([(round(t, 2), round(r, 1), n) for t, r, n in samples]),
    }
    for group in ("healthy", "faulty"):
        for phase in PHASES:
            if (group, phase) in tally.latencies:
                out[f"{group}_{phase}_count"] = len(tally.latencies[(group, phase)])
                out[f"{group}_{phase}_p50_ms"] = pct(group, phase, 50)
                out[f"{group}_{phase}_p99_ms"] = pct(group, phase, 99)
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of the server process (its threads included)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _thin(points: list[Any], most: int = 120) -> list[Any]:
    step = max(1, -(-len(points) // most))
    return points[::step] + (
        [points[-1]] if points and (len(points) - 1) % step else []
    )


async def one_run(
    args: argparse.Namespace, healthy: int, faulty: int
) -> dict[str, Any]:
    """A fresh server, one run against it, the server stopped (hung threads of a run never reach the next)."""
    from roll_async.env_service.server_cli import launch_server_process

    process, url = launch_server_process(
        "--isolation",
        args.isolation,
        "--max-envs",
        str(healthy + faulty + 64),
        "--threads",
        str(args.threads),
        "--env-timeout-s",
        str(args.call_timeout_s),
    )
    try:
        return await drive(url, process.pid, healthy, faulty, args)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except Exception:
            process.kill()


SUMMARY_KEYS = (
    "sessions_completed",
    "requests",
    "requests_per_s",
    "server_cpu_ms_per_request",
    "failures",
    "lost",
    "envs_left_on_server",
    "fault_timeouts",
    "healthy_p50_ms",
    "healthy_p99_ms",
    *(f"healthy_{p}_{q}_ms" for p in PHASES for q in ("p50", "p99")),
    "server_rss_idle_mib",
    "server_rss_peak_mib",
    "server_rss_per_session_kib",
    "server_threads_peak",
)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: spread([r[key] for r in runs])
        for key in SUMMARY_KEYS
        if all(r.get(key) is not None for r in runs)
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    faulty = round(args.sessions * args.faulty_fraction) if args.fault else 0
    healthy = args.sessions - faulty
    kinds = {"no_fault": (healthy, 0)}
    if faulty:
        kinds[f"with_{args.fault}"] = (healthy, faulty)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for repeat in range(args.repeats):
        for kind, (h, f) in kinds.items():
            result = await one_run(args, h, f)
            brief = {
                k: result[k]
                for k in (
                    "requests",
                    "failures",
                    "lost",
                    "fault_timeouts",
                    "healthy_p50_ms",
                    "healthy_p99_ms",
                    "server_rss_peak_mib",
                    "server_threads_peak",
                    "seconds",
                )
            }
            print(
                f"repeat {repeat} {kind}: {brief} {result['failure_kinds'] or ''}",
                flush=True,
            )
            runs[kind].append(result)
    payload: dict[str, Any] = {
        "isolation": args.isolation,
        "sessions": args.sessions,
        "healthy_sessions": healthy,
        "faulty_sessions": faulty,
        "fault": args.fault,
        "steps_per_session": args.steps_per_session,
        "max_seconds": args.max_seconds,
        "call_timeout_s": args.call_timeout_s,
        "fault_timeout_s": args.fault_timeout_s,
        "hang_s": args.hang_s if args.fault == "hang" else None,
        "slow_s": args.slow_s if args.fault == "slow" else None,
        "server_threads": args.threads,
        "sample_s": args.sample_s,
        "open_files_limit": args.open_files,
        "load_average_at_start": args.load_at_start,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "summary": {kind: summarize(r) for kind, r in runs.items()},
    }
    if faulty:
        base = [r["healthy_p99_ms"] for r in runs["no_fault"]]
        with_fault = [r["healthy_p99_ms"] for r in runs[f"with_{args.fault}"]]
        payload["healthy_p99_ratio"] = spread([w / b for w, b in zip(with_fault, base)])
    return payload


def to_markdown(payload: dict[str, Any]) -> str:
    def fmt(d: dict[str, Any] | None, p: int = 0) -> str:
        if d is None:
            return "-"
        return f"{d['median']:,.{p}f} ({d['min']:,.{p}f}-{d['max']:,.{p}f})"

    m = payload["machine"]
    fault = payload["fault"]
    title = f"{payload['sessions']:,} sessions, {payload['isolation']} isolation"
    if fault:
        title += f", {payload['faulty_sessions']} with a {fault} env"
    lines = [
        f"# Env server load test ({title})",
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, {m.get('memory_gib')} GiB; load generator and "
        f"server on the same cores, loopback only; load average {payload['load_average_at_start']} at start, "
        f"{payload['load_average_at_end']} at end.  ",
        f"Recorded {payload['recorded_at']}; {payload['steps_per_session']} steps per session (countdown, "
        f"3-step episodes), at most {payload['max_seconds']:g} s per run; median over "
        f"{len(next(iter(payload['runs'].values())))} runs (min-max), a fresh server per run.",
        "",
    ]
    kinds = list(payload["summary"])
    header = "| | " + " | ".join(k.replace("_", " ") for k in kinds) + " |"
    lines += [header, "|---|" + "---|" * len(kinds)]
    rows = [
        ("sessions (healthy + faulty)", None, 0),
        ("sessions completed", "sessions_completed", 0),
        ("requests", "requests", 0),
        ("requests/s", "requests_per_s", 0),
        ("server CPU ms per request", "server_cpu_ms_per_request", 2),
        ("**failures**", "failures", 0),
        ("**lost requests**", "lost", 0),
        ("envs left on the server", "envs_left_on_server", 0),
        ("faulty calls timed out (expected)", "fault_timeouts", 0),
        ("**healthy reset+step p50 ms**", "healthy_p50_ms", 1),
        ("**healthy reset+step p99 ms**", "healthy_p99_ms", 1),
        *((f"healthy {p} p50 / p99 ms", p, 1) for p in PHASES),
        ("server RSS idle MiB", "server_rss_idle_mib", 1),
        ("**server RSS peak MiB**", "server_rss_peak_mib", 1),
        ("server RSS (peak - idle) per session KiB", "server_rss_per_session_kib", 1),
        ("server threads peak", "server_threads_peak", 0),
    ]
    for label, key, p in rows:
        cells = []
        for kind in kinds:
            s = payload["summary"][kind]
            run0 = payload["runs"][kind][0]
            if key is None:
                cells.append(f"{run0['healthy_sessions']} + {run0['faulty_sessions']}")
            elif key in PHASES:
                cells.append(
                    f"{fmt(s.get(f'healthy_{key}_p50_ms'), p)} / {fmt(s.get(f'healthy_{key}_p99_ms'), p)}"
                )
            else:
                cells.append(fmt(s.get(key), p))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "healthy_p99_ratio" in payload:
        r = payload["healthy_p99_ratio"]
        lines += [
            "",
            f"Healthy sessions' reset+step p99 beside {payload['faulty_sessions']} {fault} envs ÷ without them "
            f"(same repeat, side by side): **{r['median']:.2f}×** ({r['min']:.2f}-{r['max']:.2f}).",
        ]
    lines += [
        "",
        "A closed loop: every session sends its next request when the last one is answered, so on two "
        "shared cores latency is mostly the queue of the other sessions' requests (Little's law: "
        "sessions ÷ requests/s). Server RSS is sampled every "
        f"{payload.get('sample_s', 0.25):g} s"
        + (
            ", summed over the server and its env processes (pages they share counted in each)."
            if payload["isolation"] == "process"
            else "."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isolation", choices=("none", "process"), default="none")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--steps-per-session", type=int, default=6)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="a run issues no request after this (default 60)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=16, help="server core threads (--threads)"
    )
    parser.add_argument(
        "--call-timeout-s",
        type=float,
        default=30.0,
        help="per-call timeout of healthy sessions (server side; default 30)",
    )
    parser.add_argument(
        "--faulty-fraction",
        type=float,
        default=0.0,
        help="fraction of sessions whose env is faulty (with --fault)",
    )
    parser.add_argument("--fault", choices=FAULTS, default=None)
    parser.add_argument(
        "--fault-timeout-s",
        type=float,
        default=2.0,
        help="per-call timeout of faulty sessions (the server drops the env past it)",
    )
    parser.add_argument(
        "--hang-s", type=float, default=60.0, help="how long a hung step sleeps"
    )
    parser.add_argument(
        "--slow-s", type=float, default=1.0, help="how long a slow step sleeps"
    )
    parser.add_argument(
        "--sample-s", type=float, default=0.25, help="server RSS sampling period"
    )
    add_output_args(parser, name_default=None)
    args = parser.parse_args(argv)
    if bool(args.fault) != (args.faulty_fraction > 0):
        parser.error("--fault and --faulty-fraction go together")
    default_name = f"env_server_load_{args.isolation}" + (
        f"_{args.fault}" if args.fault else ""
    )
    out = ResultFiles.claim(
        args.name or default_name, [".json", ".md"], overwrite=args.overwrite
    )
    before, after = raise_open_files_limit()
    if after != before:
        print(
            f"raised the open-files limit from {before} to {after} (each session is a connection)"
        )
    args.open_files = after
    if 0 <= after < args.sessions + 256:
        print(
            f"warning: the open-files limit is {after} (hard limit included) and {args.sessions} "
            "sessions need a descriptor each: expect 'Too many open files' (raise it with ulimit -Hn)"
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
