"""What the report shows, computed from a run directory (no engine, no Ray, no tokenizer).

Inputs: ``config.yaml`` (how many env instances there are), ``metrics.jsonl``,
``trajectories.jsonl`` (served episodes with per-turn timestamps) and
``unserved_trajectories.jsonl`` (episodes played but not trained on, with their
``fate``). Times become seconds since the earliest event of the run.

Spans of one env row: ``waiting`` (the env asked for an episode and had none:
quota full, sync pause), ``reset`` (env build and reset), ``generate``
(coloured by weight version), ``env_step``, ``reward`` (a judge or reward model
scoring the finished episode, ``custom_envs.<Tag>.reward``, or with ``per_turn`` one
thin span per scored turn: they overlap the turns that follow), and inside them the env's own
named spans (``Trajectory.env_spans``: the swe env's ``workspace_start``, each ``exec`` and
``verify``), one colour per name; under them a thin ``queued`` lane from an episode's end until its
batch left the scheduler.

A straggler is an episode that took at least twice the median duration of
the episodes created for the same step (and at least one second longer): the
ones a per-batch barrier would wait for. A "trainer" row above the envs shows
each train step (``timestamp/train_{start,end}`` in metrics.jsonl).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from roll_async.errors import MissingFileError
from roll_async.scheduler.layout import env_layout

#: Curves drawn when the run has them: (chart title, [(metric key, label)]).
CURVES: list[tuple[str, list[tuple[str, str]]]] = [
    ("Throughput (trajectories/s)", [("rollout/trajectories_per_s", "trajectories/s")]),
    ("Throughput (tokens/s)", [("rollout/tokens_per_s", "tokens/s")]),
    (
        "Reward",
        [
            ("rollout/episode_reward/mean", "episode reward (rollout)"),
            ("val/episode_reward/mean", "episode reward (validation)"),
        ],
    ),
    ("Loss", [("train/loss", "train/loss")]),
    (
        "Step time (s)",
        [
            ("time/step_rollout", "rollout"),
            ("time/step_train", "train"),
            ("time/step_weight_sync", "weight sync"),
        ],
    ),
]

#: Longest trajectory text kept in the browser; longer texts are cut in the middle.
_MAX_TEXT_CHARS = 6000
#: Most trajectories in the browser (all unserved ones, then the latest served ones).
MAX_BROWSER_TRAJECTORIES = 1500
STRAGGLER_FACTOR = 2.0


@dataclass
class ReportData:
    """Everything the page renders; ``to_json`` is embedded in the HTML."""

    run_dir: str
    kind: str
    mode: str
    env_ids: list[int]
    env_tags: dict[int, str]
    episodes: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    curves: list[dict[str, Any]] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    median_episode_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    train_spans: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "kind": self.kind,
            "mode": self.mode,
            "env_ids": self.env_ids,
            "env_tags": {str(k): v for k, v in self.env_tags.items()},
            "episodes": self.episodes,
            "curves": self.curves,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "trajectories": self.trajectories,
            "t0": self.t0,
            "median_episode_s": self.median_episode_s,
            "counts": self.counts,
            "train_spans": self.train_spans,
        }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line (a run killed mid-write may leave a partial last line; it is skipped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def configured_env_ids(config: dict[str, Any]) -> dict[int, str]:
    """env_id -> tag of every train env instance the config creates (the scheduler's layout)."""
    em = config.get("train_env_manager") or {}
    tags = list(em.get("tags") or [])
    if not tags:
        return {}
    layout = env_layout(
        tags,
        int(em.get("num_env_groups", 0)),
        list(em.get("num_groups_partition") or []),
        int(em.get("group_size", 1)),
        int(em.get("group_size_redundancy", 0)),
    )
    return {env_id: tag for env_id, tag in layout}


def _rel(value: Any, t0: float) -> float | None:
    return round(float(value) - t0, 4) if value else None


def _episode(record: dict[str, Any], fate: str, t0: float) -> dict[str, Any]:
    turns = []
    for turn in record.get("turns") or []:
        turns.append(
            {
                "gs": _rel(turn.get("generate_started_at"), t0),
                "gf": _rel(turn.get("generate_finished_at"), t0),
                "es": _rel(turn.get("env_step_started_at"), t0),
                "ef": _rel(turn.get("env_step_finished_at"), t0),
                "v": turn.get("weight_version"),
                "n": turn.get("generated_tokens"),
                # The judge / reward model scoring this turn (reward.per_turn), if any.
                "rs": _rel(turn.get("reward_started_at"), t0),
                "rf": _rel(turn.get("reward_finished_at"), t0),
            }
        )
    return {
        "traj_id": record.get("traj_id"),
        "env_id": record.get("env_id"),
        # A game's seat ("seat0", "seat1", ...): each trained seat is its own trajectory of the same env.
        "role": record.get("role") or "",
        "fate": fate,
        "requested": _rel(record.get("episode_requested_at"), t0),
        "start": _rel(record.get("started_at"), t0),
        "end": _rel(record.get("finished_at"), t0),
        "served": _rel(record.get("served_at"), t0),
        # The judge / reward model scoring the finished episode (custom_envs.<Tag>.reward), if any.
        "rs": _rel(record.get("reward_started_at"), t0),
        "rf": _rel(record.get("reward_finished_at"), t0),
        "served_step": record.get("served_step"),
        "created_step": record.get("created_step"),
        "reward": record.get("episode_reward"),
        "stop_reason": record.get("stop_reason"),
        "error": record.get("error"),
        "straggler": False,
        "turns": turns,
        # The env's own named spans (workspace start, commands, verifier), drawn inside the episode's row.
        "env_spans": [
            {
                "name": str(span.get("name")),
                "s": _rel(span.get("started_at"), t0),
                "f": _rel(span.get("finished_at"), t0),
                "turn": span.get("turn", -1),
            }
            for span in record.get("env_spans") or []
            if isinstance(span, dict) and span.get("name")
        ],
    }


def _segments(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded conversation split into context and generated turns.

    Each turn's ``action_text`` is located from the end backwards (turn k is the last occurrence before turn
    k+1): the system prompt before the first turn often quotes the answer format, the observation after a turn
    rarely repeats a whole reply.
    """
    text = record.get("text")
    turns = record.get("turns") or []
    if not isinstance(text, str):
        segments: list[dict[str, Any]] = []
        for turn in turns:
            segments.append(
                {
                    "kind": "generated",
                    "text": turn.get("action_text", ""),
                    "turn": turn.get("turn"),
                }
            )
            if turn.get("observation"):
                segments.append({"kind": "context", "text": turn["observation"]})
        return segments
    found: list[tuple[int, int, Any]] = []
    limit = len(text)
    for turn in reversed(turns):
        action = turn.get("action_text") or ""
        at = text.rfind(action, 0, limit) if action else -1
        if at < 0:
            continue
        found.append((at, at + len(action), turn.get("turn")))
        limit = at
    segments = []
    cursor = 0
    for start, end, turn_index in reversed(found):
        if start > cursor:
            segments.append({"kind": "context", "text": text[cursor:start]})
        segments.append(
            {"kind": "generated", "text": text[start:end], "turn": turn_index}
        )
        cursor = end
    if cursor < len(text):
        segments.append({"kind": "context", "text": text[cursor:]})
    return _cut_long(segments)


def _cut_long(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    total = sum(len(s["text"]) for s in segments)
    if total <= _MAX_TEXT_CHARS:
        return segments
    for segment in segments:  # shorten context first: it is the long, repeated part
        if segment["kind"] == "context" and len(segment["text"]) > 400:
            cut = segment["text"]
            segment["text"] = (
                cut[:200] + f"\n[... {len(cut) - 400} characters ...]\n" + cut[-200:]
            )
    return segments


def _browser_entry(record: dict[str, Any], fate: str) -> dict[str, Any]:
    return {
        "traj_id": record.get("traj_id"),
        "fate": fate,
        "tag": record.get("tag"),
        "env_id": record.get("env_id"),
        "group_id": record.get("group_id"),
        "episode_id": record.get("episode_id"),
        "seed": record.get("seed"),
        "reward": record.get("episode_reward"),
        "stop_reason": record.get("stop_reason"),
        "error": record.get("error"),
        "created_step": record.get("created_step"),
        "served_step": record.get("served_step"),
        "versions": [
            record.get("oldest_weight_version"),
            record.get("newest_weight_version"),
        ],
        "num_tokens": record.get("num_tokens"),
        "response_length": record.get("response_length"),
        "turns": [
            {
                "turn": t.get("turn"),
                "tokens": t.get("generated_tokens"),
                "version": t.get("weight_version"),
                "reward": t.get("reward"),
                "finish": t.get("finish_reason"),
                "generate_s": t.get("generate_s"),
                "env_step_s": t.get("env_step_s"),
                "resumed": t.get("resumed_generations", 0),
            }
            for t in record.get("turns") or []
        ],
        "segments": _segments(record),
    }


def _mark_stragglers(episodes: list[dict[str, Any]]) -> float:
    """Mark stragglers per created step (steps differ: load, policy); returns the median episode time of the run."""
    timed = [e for e in episodes if e["start"] is not None and e["end"] is not None]
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for episode in timed:
        by_step.setdefault(episode["created_step"], []).append(episode)
    for group in by_step.values():
        median = statistics.median(e["end"] - e["start"] for e in group)
        for episode in group:
            duration = episode["end"] - episode["start"]
            episode["straggler"] = (
                duration >= STRAGGLER_FACTOR * median and duration - median >= 1.0
            )
    return statistics.median(e["end"] - e["start"] for e in timed) if timed else 0.0


def _train_spans(metrics: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    spans = []
    for record in metrics:
        start, end = (
            record.get("timestamp/train_start"),
            record.get("timestamp/train_end"),
        )
        if (
            isinstance(start, (int, float))
            and isinstance(end, (int, float))
            and end >= start
        ):
            spans.append(
                {
                    "step": record.get("step"),
                    "start": _rel(start, t0),
                    "end": _rel(end, t0),
                }
            )
    return spans


def _curves(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    curves = []
    for title, series_spec in CURVES:
        series = []
        for key, label in series_spec:
            points = [
                [r["step"], r[key]]
                for r in metrics
                if isinstance(r.get(key), (int, float)) and "step" in r
            ]
            if points:
                series.append({"key": key, "label": label, "points": points})
        if series:
            curves.append({"title": title, "series": series})
    return curves


def load_report_data(run_dir: str | Path) -> ReportData:
    """Read a run directory; raises MissingFileError naming what is missing."""
    root = Path(run_dir)
    config_path = root / "config.yaml"
    if not config_path.is_file():
        raise MissingFileError(
            f"{root} is not a run directory: it has no config.yaml (pass the output_dir of a run)"
        )
    config = yaml.safe_load(config_path.read_text()) or {}
    metrics = read_jsonl(root / "metrics.jsonl")
    served = read_jsonl(root / "trajectories.jsonl")
    unserved = read_jsonl(root / "unserved_trajectories.jsonl")

    env_tags = configured_env_ids(config)
    for record in served + unserved:
        env_tags.setdefault(int(record.get("env_id", -1)), str(record.get("tag")))
    times = [
        float(r[k])
        for r in served + unserved
        for k in ("episode_requested_at", "started_at")
        if r.get(k)
    ]
    t0 = min(times) if times else 0.0

    episodes = [_episode(r, "served", t0) for r in served] + [
        _episode(r, r.get("fate", "unserved"), t0) for r in unserved
    ]
    median = _mark_stragglers(episodes)
    staleness: dict[int, int] = {}
    for record in served:
        if (
            record.get("served_step") is not None
            and record.get("created_step") is not None
        ):
            lag = int(record["served_step"]) - int(record["created_step"])
            staleness[lag] = staleness.get(lag, 0) + 1

    room = max(0, MAX_BROWSER_TRAJECTORIES - len(unserved))
    browser = [
        _browser_entry(r, r.get("fate", "unserved"))
        for r in unserved[:MAX_BROWSER_TRAJECTORIES]
    ]
    browser += [_browser_entry(r, "served") for r in (served[-room:] if room else [])]
    stragglers = {e["traj_id"] for e in episodes if e["straggler"]}
    for entry in browser:
        entry["straggler"] = entry["traj_id"] in stragglers

    counts: dict[str, int] = {"served": len(served), "stragglers": len(stragglers)}
    for record in unserved:
        fate = str(record.get("fate", "unserved"))
        counts[fate] = counts.get(fate, 0) + 1
    is_train = any("train/loss" in r for r in metrics)
    return ReportData(
        run_dir=str(root.resolve()),
        kind="train" if is_train else "rollout",
        mode=str(config.get("mode", "")),
        env_ids=sorted(env_tags),
        env_tags=env_tags,
        episodes=episodes,
        metrics=metrics,
        curves=_curves(metrics),
        staleness=staleness,
        trajectories=browser,
        t0=t0,
        median_episode_s=median,
        counts=counts,
        train_spans=_train_spans(metrics, t0),
    )
