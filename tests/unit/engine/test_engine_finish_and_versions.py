"""The vLLM wrapper's translation of finish reasons, per-token weight-version spans and logprobs (no engine needed)."""

from __future__ import annotations

from dataclasses import dataclass

from roll_async.engine.engine_outputs import (
    engine_finish_reason,
    sampled_logprobs,
    versions_per_token,
)


@dataclass
class Span:  # the shape of vllm.outputs.WeightVersionSpan
    version: str
    start: int
    end: int


def test_error_finish_reason_is_kept_for_the_retry_path_not_turned_into_stop():
    assert engine_finish_reason("error") == "error"
    assert [engine_finish_reason(r) for r in ("stop", "length", "abort")] == [
        "stop",
        "length",
        "abort",
    ]
    assert engine_finish_reason(None) == "abort"
    assert engine_finish_reason("repetition") == "stop"


def test_version_spans_become_one_version_per_token():
    assert versions_per_token([Span("3", 0, 2), Span("4", 2, 5)], 5, fallback=9) == [
        3,
        3,
        4,
        4,
        4,
    ]
    assert versions_per_token(None, 3, fallback=2) == [2, 2, 2]
    assert versions_per_token([Span("default", 0, 2)], 2, fallback=0) == [0, 0]


def test_sampled_logprobs_read_from_flat_and_from_per_position_maps_agree():
    from vllm.logprobs import FlatLogprobs, Logprob

    sampled = [5, 9, 5]
    maps = [
        {5: Logprob(-0.5, rank=1)},
        {
            2: Logprob(-0.1, rank=1),
            9: Logprob(-2.0, rank=3),
        },  # the sampled token is not the first entry
        {5: Logprob(-1.25, rank=2)},
    ]
    flat = FlatLogprobs()
    flat.extend(maps)
    assert (
        sampled_logprobs(flat, sampled)
        == sampled_logprobs(maps, sampled)
        == [-0.5, -2.0, -1.25]
    )
    assert sampled_logprobs(None, sampled) == [0.0, 0.0, 0.0]


def test_flat_logprobs_are_asked_for_only_where_vllm_has_the_option(monkeypatch):
    """vLLM 0.11 (allowed by the gpu extra) has no SamplingParams.flat_logprobs: passing it would fail every request."""
    from roll_async.engine import vllm_engine
    from roll_async.trajectory import GenerationRequest

    engine = vllm_engine.VLLMEngine("unused-model-path")
    request = GenerationRequest(request_id="r", prompt_token_ids=[1, 2], max_tokens=4)
    assert vllm_engine.supports_flat_logprobs()  # vLLM 0.32 here
    assert engine._sampling_params(request).flat_logprobs is True
    monkeypatch.setattr(vllm_engine, "supports_flat_logprobs", lambda: False)
    # not passed: vLLM's default (per-position maps)
    assert engine._sampling_params(request).flat_logprobs is False
