"""The SIMULATED engine of the scale benchmark (benchmarks/sim_engine.py): latency model and engine API."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.sim_engine import DecodeLatencyModel, SimEngine, output_length
from roll_async.trajectory import GenerationRequest

CEILING = {
    "rows": [
        {"concurrency": 1, "decode_step_s": 0.004},
        {"concurrency": 4, "decode_step_s": 0.005},
        {"concurrency": 16, "decode_step_s": 0.008},
        {"concurrency": 64, "decode_step_s": 0.020},
    ]
}


def test_step_time_interpolates_between_measured_concurrencies():
    model = DecodeLatencyModel.from_ceiling(CEILING)
    assert model.step_time(0) == 0.0
    assert model.step_time(1) == pytest.approx(0.004)
    assert model.step_time(4) == pytest.approx(0.005)
    assert model.step_time(10) == pytest.approx(0.005 + 0.003 * 6 / 12)
    assert model.step_time(40) == pytest.approx(0.008 + 0.012 * 24 / 48)
    assert model.step_time(64) == pytest.approx(0.020)


def test_step_time_extrapolates_with_the_last_slope_and_never_below_the_smallest_measurement():
    model = DecodeLatencyModel.from_ceiling(CEILING)
    slope = (0.020 - 0.008) / 48
    assert model.step_time(1064) == pytest.approx(0.020 + slope * 1000)
    assert model.step_time(0.5) == pytest.approx(0.004)
    assert model.tokens_per_s(64) == pytest.approx(64 / 0.020)
    # Unsorted input and a file path work too; bad input is rejected.
    flat = DecodeLatencyModel([64, 1], [0.02, 0.004])
    assert flat.step_time(32.5) == pytest.approx(0.004 + 0.016 * 31.5 / 63)
    with pytest.raises(ValueError):
        DecodeLatencyModel([], [])
    with pytest.raises(ValueError):
        DecodeLatencyModel([1], [0.0])


def test_calibration_from_the_recorded_ceiling_file(tmp_path):
    path = tmp_path / "ceiling.json"
    path.write_text(json.dumps(CEILING))
    assert DecodeLatencyModel.from_ceiling(path).step_time(16) == pytest.approx(0.008)


def test_output_lengths_are_repeatable_capped_and_have_the_requested_mean():
    lengths = [output_length(f"req-{i}", 8.0, 10_000) for i in range(4000)]
    assert lengths == [output_length(f"req-{i}", 8.0, 10_000) for i in range(4000)]
    assert 7.0 < sum(lengths) / len(lengths) < 9.0
    assert (
        max(output_length(f"req-{i}", 8.0, 5) for i in range(500)) == 6
    )  # cap + 1 means "hit max_tokens"


def request(i: int, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"r{i}", prompt_token_ids=[1, 2, 3], max_tokens=max_tokens
    )


async def test_sim_engine_batches_at_most_max_num_seqs_and_takes_the_modelled_time():
    model = DecodeLatencyModel([1, 4], [0.002, 0.004])
    engine = SimEngine(model, max_num_seqs=4, output_len_mean=1000, token_ids=[7, 8, 9])
    results = await asyncio.gather(
        *(engine.generate(request(i, max_tokens=5)) for i in range(8))
    )
    assert all(
        r.finish_reason == "length" and len(r.output_token_ids) == 5 for r in results
    )
    assert set(results[0].output_token_ids) <= {7, 8, 9}
    stats = await engine.stats()
    # Two waves of 4 requests x 5 tokens, each step taking step_time(4).
    assert stats["steps"] == 10 and stats["sim_time_s"] == pytest.approx(10 * 0.004)
    assert stats["generation_tokens"] == 40 and stats["in_flight"] == 0
    await engine.shutdown()


async def test_sim_engine_abort_returns_the_partial_output():
    engine = SimEngine(DecodeLatencyModel([1], [0.01]), output_len_mean=1000)
    task = asyncio.ensure_future(engine.generate(request(0, max_tokens=1000)))
    await asyncio.sleep(0.055)
    await engine.abort(["r0"])
    result = await task
    assert result.finish_reason == "abort" and 1 <= len(result.output_token_ids) < 1000
    assert engine.cpu_s >= 0.0
    await engine.shutdown()


async def test_scripted_replies_come_back_exactly_or_cut_at_max_tokens():
    def replies(request: GenerationRequest) -> list[int]:
        return [7, 8, 9] if request.request_id.startswith("a") else [5] * 10

    engine = SimEngine(
        DecodeLatencyModel.from_ceiling(CEILING), time_scale=100.0, replies=replies
    )
    try:
        whole, cut = await asyncio.gather(
            engine.generate(GenerationRequest("a1", [1, 2], max_tokens=8)),
            engine.generate(GenerationRequest("b1", [1, 2], max_tokens=4)),
        )
    finally:
        await engine.shutdown()
    assert (whole.output_token_ids, whole.finish_reason) == ([7, 8, 9], "stop")
    assert (cut.output_token_ids, cut.finish_reason) == ([5] * 4, "length")
