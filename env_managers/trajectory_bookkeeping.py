"""What one episode leaves in its Trajectory, written the same way by every episode.

Token ids go in with their response mask, behaviour logprobs and per-token weight
versions kept aligned (-1 and 0.0 on prompt and env tokens), the episode's
weight-version range follows the versions that sampled it, and env ``info`` becomes
numeric metrics, the env's own timeline spans and a judge's reference answer. These
are plain functions on a Trajectory so the per-env episode loop
(roll_async.env_managers.env_manager) holds only the loop.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from roll_async.errors import ChatTemplateError
from roll_async.metrics import PREFIX_MISMATCH
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.trajectory import EnvSpan, Trajectory, TurnRecord


def numeric_metrics(info: Any) -> dict[str, float]:
    """The numbers in an env step's ``info["metrics"]`` (others dropped): a turn's metrics."""
    metrics = info.get("metrics", {}) if isinstance(info, dict) else {}
    out: dict[str, float] = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, (bool, int, float)):
            out[str(key)] = float(value)
    return out


def note_env_spans(trajectory: Trajectory, info: Any, turn: int) -> None:
    """Keep the spans an env reported in ``info["env_spans"]`` (reset: ``turn`` -1) on the trajectory.

    A span without a name, with a time that is not a number or ending before it starts is left out:
    it is the env's timeline, never a reason to fail its episode.
    """
    spans = info.get("env_spans") if isinstance(info, dict) else None
    for span in spans if isinstance(spans, list) else []:
        if not isinstance(span, dict) or not span.get("name"):
            continue
        start, end = span.get("started_at"), span.get("finished_at")
        if not (_is_time(start) and _is_time(end)) or end < start:
            continue
        trajectory.env_spans.append(
            EnvSpan(str(span["name"]), float(start), float(end), turn)
        )


def _is_time(value: Any) -> TypeGuard[float]:
    """A number (an int or a float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def env_reference(info: dict[str, Any]) -> str | None:
    """The reference answer an env gives on reset (``info["reference"]`` or ``info["answer"]``), for a judge."""
    for key in ("reference", "answer"):
        if info.get(key) is not None:
            return str(info[key])
    return None


def episode_metrics(turns: list[TurnRecord]) -> dict[str, float]:
    """Mean of each env metric over the turns that reported it; ``success`` is the last turn's value."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for turn in turns:
        for key, value in turn.metrics.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    merged = {key: sums[key] / counts[key] for key in sums}
    for turn in reversed(turns):
        if "success" in turn.metrics:
            merged["success"] = turn.metrics["success"]
            break
    return merged


def append_tokens(
    trajectory: Trajectory,
    ids: list[int],
    *,
    generated: bool,
    logprobs: list[float] | None = None,
    versions: list[int] | None = None,
) -> None:
    """Extend the trajectory's ids, mask, logprobs and token versions together (aligned)."""
    trajectory.token_ids.extend(ids)
    trajectory.response_mask.extend([1 if generated else 0] * len(ids))
    if generated and logprobs is not None:
        trajectory.logprobs.extend(logprobs)
    else:
        trajectory.logprobs.extend([0.0] * len(ids))
    if generated and versions is not None and len(versions) == len(ids):
        trajectory.token_versions.extend(versions)
    else:
        trajectory.token_versions.extend([-1] * len(ids))


def note_versions(trajectory: Trajectory, versions: list[int]) -> None:
    """Widen the trajectory's oldest/newest weight version to cover ``versions``."""
    for version in versions:
        if (
            trajectory.oldest_weight_version is None
            or version < trajectory.oldest_weight_version
        ):
            trajectory.oldest_weight_version = version
        if (
            trajectory.newest_weight_version is None
            or version > trajectory.newest_weight_version
        ):
            trajectory.newest_weight_version = version


def check_prefix(
    prompts: ChatPromptBuilder,
    trajectory: Trajectory,
    user_texts: list[str],
    generated: list[list[int]],
) -> None:
    """Does a fresh render of this conversation's text differ from its ids? (rollout/prefix_mismatch_rate)"""
    if trajectory.images:
        return  # image placeholders are expanded by the processor: a text-only render is not comparable
    try:
        differs = prompts.fresh_render_differs(
            trajectory.token_ids, user_texts, generated
        )
    except ChatTemplateError:
        return  # the template cannot render this history from text at all; nothing to compare
    trajectory.metrics[PREFIX_MISMATCH] = float(differs)
