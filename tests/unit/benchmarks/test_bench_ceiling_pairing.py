"""The grouping benchmark measures the engine ceiling after every repeat (FAKE engine, in process).

The machine's speed drifts between repeats, so each repeat's per-env ÷ ceiling ratio is taken
against the ceiling measured right after it, and the row reports the spread of those ceilings.
"""

from __future__ import annotations

import asyncio

from benchmarks.env_grouping import (
    BenchConfig,
    BenchContext,
    GridPoint,
    Workload,
    run_point,
)
from roll_async.config.schema import EngineConfig
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine


async def test_every_repeat_gets_its_own_ceiling_and_its_ratio_uses_it():
    tokenizer = build_chatml_test_tokenizer()
    engine = FakeEngine(
        tokens_per_request=4,
        default_token_id=tokenizer.convert_tokens_to_ids("a"),
        latency_s=0.002,
    )
    ctx = BenchContext(
        "inprocess",
        "unused",
        tokenizer,
        EngineConfig(max_num_seqs=8, max_model_len=512),
        engine,
        engine=engine,
    )
    envs = {
        "Zero": {
            "env_type": "longtail",
            "max_steps": 2,
            "max_tokens_per_step": 4,
            "stop": [],
            "isolation": "inline",
            "env_config": {
                "min_turns": 2,
                "max_turns": 2,
                "turns_alpha": 0,
                "observation_words_sigma": 0,
            },
        }
    }
    workload = Workload(
        name="zl",
        schedulers=["per_env", "barrier"],
        repeats=2,
        ceiling=True,
        custom_envs=envs,
        grid=[GridPoint(num_env_groups=2, group_size=2, max_env_num_per_worker=4)],
    )
    bench = BenchConfig(
        name="t",
        workloads=[workload],
        transport="inprocess",
        sequence_length=256,
        num_batches=1,
        ceiling_rounds=1,
        per_env_warmup_s=0.0,
        sample_interval_s=0.01,
    )
    rows = await asyncio.wait_for(
        run_point(ctx, bench, workload, workload.grid[0], ceiling=True), 60
    )

    per_env = next(r for r in rows if r["scheduler"] == "per_env")
    assert per_env["repeats"] == 2
    # one ceiling after each repeat
    assert per_env["ceiling_tokens_per_s_runs"]["n"] == 2
    ceiling_requests = [
        r for r in engine.requests if r.request_id.startswith("ceiling")
    ]
    # two measurements of one round at the point's concurrency (4 envs)
    assert len(ceiling_requests) == 2 * 4
    assert per_env["tokens_vs_ceiling_runs"]["n"] == 2
    # the row's ceiling is one of the measured ones (the median repeat's), and the pooled ratio uses it
    assert (
        per_env["ceiling_tokens_per_s"]
        in per_env["ceiling_tokens_per_s_runs"]["values"]
    )
    assert (
        abs(
            per_env["tokens_vs_ceiling"]
            - per_env["tokens_per_s"] / per_env["ceiling_tokens_per_s"]
        )
        < 1e-9
    )


async def test_ceiling_prompts_are_never_repeated_so_the_prefix_cache_cannot_serve_them():
    from benchmarks.engine_ceiling import measure

    engine = FakeEngine(tokens_per_request=4)
    await measure(engine, n=16, prompt_len=32, output_len=4, rounds=3)
    await measure(engine, n=16, prompt_len=32, output_len=4, rounds=3)
    # vLLM caches whole 16-token blocks
    first_blocks = [tuple(r.prompt_token_ids[:16]) for r in engine.requests]
    assert len(first_blocks) == 2 * 3 * 16 and len(set(first_blocks)) == len(
        first_blocks
    )
    assert all(10 <= t < 210 for r in engine.requests for t in r.prompt_token_ids)
