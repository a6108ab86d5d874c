"""The vLLM wrapper's translation of finish reasons and per-token weight-version spans (no engine needed)."""

from __future__ import annotations

from dataclasses import dataclass

from roll_async.engine.vllm_engine import _token_versions, engine_finish_reason


@dataclass
class Span:  # the shape of vllm.outputs.WeightVersionSpan
    version: str
    start: int
    end: int


def test_error_finish_reason_is_kept_for_the_retry_path_not_turned_into_stop():
    assert engine_finish_reason("error") == "error"
    assert [engine_finish_reason(r) for r in ("stop", "length", "abort")] == ["stop", "length", "abort"]
    assert engine_finish_reason(None) == "abort"
    assert engine_finish_reason("repetition") == "stop"


def test_version_spans_become_one_version_per_token():
    assert _token_versions([Span("3", 0, 2), Span("4", 2, 5)], 5, fallback=9) == [3, 3, 4, 4, 4]
    assert _token_versions(None, 3, fallback=2) == [2, 2, 2]
    assert _token_versions([Span("default", 0, 2)], 2, fallback=0) == [0, 0]
