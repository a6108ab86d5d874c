"""vLLM's per-request outputs in the rollout's vocabulary: finish reasons, logprobs, token versions.

vLLM's output shapes differ between versions (flat logprobs from 0.12 on, maps before)
and its finish reasons and weight-version spans are not ours; these pure functions
translate one finished request's output, apart from the engine wrapper
(roll_async.engine.vllm_engine) that runs requests, so they are tested without an engine.
"""

from __future__ import annotations

from typing import Any

from roll_async.trajectory import FinishReason


def sampled_logprobs(entries: Any, token_ids: list[int]) -> list[float]:
    """The sampled token's logprob at each position, from vLLM's flat logprobs or, before vLLM 0.12, its
    {token_id: Logprob} maps."""
    if entries is None:
        return [0.0] * len(token_ids)
    starts = getattr(entries, "start_indices", None)
    # FlatLogprobs: with logprobs=0 each position holds the sampled token alone
    if starts is not None:
        ids, flat, ends = entries.token_ids, entries.logprobs, entries.end_indices
        values = []
        for position, token_id in enumerate(token_ids):
            start = starts[position]
            if ids[start] != token_id:  # not first: look through the position's entries
                start += ids[start : ends[position]].index(token_id)
            values.append(float(flat[start]))
        return values
    values = []
    for position, token_id in enumerate(token_ids):
        entry = entries[position]
        values.append(float(entry[token_id].logprob))
    return values


def engine_finish_reason(raw: Any) -> FinishReason:
    """vLLM's finish reason in our vocabulary: ``error`` (retryable engine fault) stays ``error``.

    ``repetition`` (vLLM's hallucination guard) ended a complete-looking reply: ``stop``;
    None (no final output) is ``abort``.
    """
    if raw is None:
        return "abort"
    reason = str(raw)
    if reason in ("stop", "length", "abort", "error"):
        return reason  # type: ignore[return-value]
    return "stop"


def versions_per_token(spans: Any, num_tokens: int, fallback: int) -> list[int]:
    """One weight version per output token from vLLM's ``WeightVersionSpan`` list (``[start, end)`` → label).

    vLLM labels each engine step's tokens with the version set by ``update_weight_version``
    (which changes only while generation is paused). Tokens without a label get ``fallback``.
    """
    versions = [fallback] * num_tokens
    for span in spans or ():
        try:
            label = int(span.version)
        except (TypeError, ValueError):
            continue
        for index in range(max(0, span.start), min(num_tokens, span.end)):
            versions[index] = label
    return versions
