"""Write report.html (template + inlined CSS/JS/data) and the Chrome-trace JSON of the timeline."""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from roll_async.report.data import ReportData, load_report_data

#: Trace thread ids of the "queued for the trainer" tracks (env id + this), apart from the env tracks.
_QUEUED_TID = 100_000
#: Trace thread ids of the per-turn reward tracks (env id + this): a turn's scoring overlaps the next turns.
_TURN_REWARD_TID = 200_000
#: Trace thread ids of a game's seats: env id * _SEATS_PER_ENV + seat + this, so both seats of one game show.
_SEAT_TID = 300_000
_SEATS_PER_ENV = 16


def seat_index(role: str) -> int | None:
    """The seat number of a game trajectory's role (``seat1`` -> 1); None for a single-agent episode."""
    match = re.fullmatch(r"seat(\d+)", role or "")
    return int(match.group(1)) if match else None


def _asset(name: str) -> str:
    return (
        resources.files("roll_async.report").joinpath(name).read_text(encoding="utf-8")
    )


def render_html(report: ReportData) -> str:
    """The page as one string; the data is JSON in a script tag (``</`` escaped so text cannot close it)."""
    payload = json.dumps(
        report.to_json(), separators=(",", ":"), allow_nan=False, default=str
    )
    payload = payload.replace("</", "<\\/").replace("<!--", "<\\!--")
    page = _asset("page.html")
    return (
        page.replace("__TITLE__", html.escape(Path(report.run_dir).name))
        .replace("/*__CSS__*/", _asset("page.css"))
        .replace("/*__JS__*/", _asset("page.js"))
        .replace("__DATA__", payload)
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``RUN_DIR/report.html`` (or ``out``) and return its path."""
    report = load_report_data(run_dir)
    path = Path(out) if out else Path(run_dir) / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


def trace_events(report: ReportData) -> list[dict[str, Any]]:
    """Chrome trace events (Perfetto opens them): one thread per env, complete ("X") events in microseconds."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "env instances"}}
    ]
    for env_id in report.env_ids:
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": env_id,
                "args": {
                    "name": f"env {env_id} {report.env_tags.get(env_id, '')}".strip()
                },
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": 1,
                "tid": env_id,
                "args": {"sort_index": env_id},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 1,
                "tid": _QUEUED_TID + env_id,
                "args": {"name": f"env {env_id}: queued for the trainer"},
            }
        )

    def span(
        name: str,
        start: float | None,
        end: float | None,
        tid: int,
        cat: str,
        args: dict[str, Any],
    ) -> None:
        if start is None or end is None or end < start:
            return
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": cat,
                "pid": 1,
                "tid": tid,
                "ts": round(start * 1e6),
                "dur": max(1, round((end - start) * 1e6)),
                "args": args,
            }
        )

    turn_reward_tracks: set[int] = set()
    seat_tracks: set[int] = set()
    for episode in report.episodes:
        env_id = tid = int(episode["env_id"])
        seat = seat_index(episode.get("role", ""))
        if (
            seat is not None
        ):  # a game: each trained seat on a track of its own under its env
            tid = _SEAT_TID + env_id * _SEATS_PER_ENV + seat
            if tid not in seat_tracks:
                seat_tracks.add(tid)
                name = (
                    f"env {env_id} {report.env_tags.get(env_id, '')} {episode['role']}"
                )
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": 1,
                        "tid": tid,
                        "args": {"name": " ".join(name.split())},
                    }
                )
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_sort_index",
                        "pid": 1,
                        "tid": tid,
                        "args": {"sort_index": env_id},
                    }
                )
        args = {
            k: episode[k]
            for k in (
                "traj_id",
                "role",
                "fate",
                "reward",
                "stop_reason",
                "created_step",
                "served_step",
                "straggler",
            )
        }
        if episode.get("error"):
            args["error"] = episode["error"]
        span(
            "waiting for an episode",
            episode["requested"],
            episode["start"],
            tid,
            "waiting",
            {},
        )
        span(
            f"episode {episode['traj_id']} ({episode['fate']})",
            episode["start"],
            episode["end"],
            tid,
            "episode",
            args,
        )
        for index, turn in enumerate(episode["turns"]):
            span(
                f"generate v{turn['v']}",
                turn["gs"],
                turn["gf"],
                tid,
                "generate",
                {
                    "turn": index,
                    "weight_version": turn["v"],
                    "generated_tokens": turn["n"],
                },
            )
            span("env step", turn["es"], turn["ef"], tid, "env_step", {"turn": index})
        for env_span in episode.get("env_spans", []):
            span(
                env_span["name"],
                env_span["s"],
                env_span["f"],
                tid,
                "env_span",
                {"turn": env_span["turn"]},
            )
        span("reward model", episode.get("rs"), episode.get("rf"), tid, "reward", {})
        for index, turn in enumerate(episode["turns"]):
            if turn.get("rs") is None:
                continue
            if tid not in turn_reward_tracks:
                turn_reward_tracks.add(tid)
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": 1,
                        "tid": _TURN_REWARD_TID + tid,
                        "args": {"name": f"env {tid}: reward model per turn"},
                    }
                )
            span(
                f"reward model turn {index}",
                turn["rs"],
                turn.get("rf"),
                _TURN_REWARD_TID + tid,
                "reward",
                {"turn": index, "traj_id": episode["traj_id"]},
            )
        if episode["fate"] == "served":
            # Queued time is the trajectory's, not the env's (which already plays the next episode): its own track.
            span(
                "queued for the trainer",
                episode["end"],
                episode["served"],
                _QUEUED_TID + env_id,
                "queued",
                {"traj_id": episode["traj_id"]},
            )
    return events


def write_trace(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``RUN_DIR/trace.json`` (Chrome trace format; open it in https://ui.perfetto.dev or chrome://tracing)."""
    report = load_report_data(run_dir)
    path = Path(out) if out else Path(run_dir) / "trace.json"
    payload = {
        "traceEvents": trace_events(report),
        "displayTimeUnit": "ms",
        "otherData": {"run_dir": report.run_dir, "t0_unix_s": report.t0},
    }
    path.write_text(json.dumps(payload, default=str), encoding="utf-8")
    return path
