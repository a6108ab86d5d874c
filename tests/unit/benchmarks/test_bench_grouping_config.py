"""The grouping benchmark's configs and command line: every run the YAMLs describe is a valid pipeline config."""

from __future__ import annotations

import pytest

from benchmarks.env_grouping import (
    FULL_CONFIG,
    QUICK_CONFIG,
    GridPoint,
    _grid,
    headline,
    load_bench_config,
    main,
    pipeline_config,
)


@pytest.mark.parametrize("path", [QUICK_CONFIG, FULL_CONFIG], ids=["quick", "full"])
def test_every_run_of_the_shipped_configs_is_a_valid_pipeline_config(path):
    bench = load_bench_config(path)
    names = [w.name for w in bench.workloads]
    assert {"zero_latency", "longtail", "builtin"} <= set(names)
    for workload in bench.workloads:
        for point in workload.grid:
            for scheduler in point.schedulers or workload.schedulers:
                config = pipeline_config(bench, workload, point, scheduler)
                assert (
                    config.train_env_manager.num_env_groups
                    * config.train_env_manager.group_size
                    == point.num_envs
                )
                assert config.mode == (
                    "sync" if scheduler == "per_env_sync" else "async"
                )
                # one thread per env in a worker: env steps never queue for a thread (the barrier does the same)
                assert config.train_env_manager.env_threads_per_worker >= min(
                    point.max_env_num_per_worker, point.num_envs
                )


def test_quick_mode_has_the_headline_comparisons():
    bench = load_bench_config(QUICK_CONFIG)
    by_name = {w.name: w for w in bench.workloads}
    assert {"per_env", "barrier"} <= set(by_name["longtail"].schedulers)
    assert (
        by_name["zero_latency"].ceiling
        and "per_env" in by_name["zero_latency"].schedulers
    )
    assert bench.transport == "ray"


def test_grid_as_a_cartesian_product_and_defaults():
    points = _grid(
        {"num_env_groups": [2, 4], "group_size": 8, "max_env_num_per_worker": [16, 64]}
    )
    assert [
        (p.num_env_groups, p.group_size, p.max_env_num_per_worker) for p in points
    ] == [(2, 8, 16), (2, 8, 64), (4, 8, 16), (4, 8, 64)]
    point = GridPoint(4, 8, 16)
    assert point.num_envs == 32 and point.batch_size == 32 and point.label == "4x8 W16"
    assert GridPoint(4, 8, 16, rollout_batch_size=16).batch_size == 16


def bench_with_schedulers(tmp_path, schedulers: str):
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"name: bad\nworkloads:\n  - name: w\n    schedulers: {schedulers}\n    custom_envs: {{}}\n"
        "    grid: [{num_env_groups: 1, group_size: 1, max_env_num_per_worker: 1}]\n"
    )
    return path


def test_unknown_scheduler_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="lockstep"):
        load_bench_config(bench_with_schedulers(tmp_path, "[per_env, lockstep]"))


def test_replay_must_follow_per_env(tmp_path):
    with pytest.raises(ValueError, match="list 'per_env' before it"):
        load_bench_config(bench_with_schedulers(tmp_path, "[replay, per_env, barrier]"))
    with pytest.raises(ValueError, match="list 'per_env' before it"):
        load_bench_config(bench_with_schedulers(tmp_path, "[replay, barrier]"))
    assert load_bench_config(
        bench_with_schedulers(tmp_path, "[per_env, replay]")
    ).workloads[0].schedulers == ["per_env", "replay"]


def test_dry_run(capsys):
    assert (
        main(
            [
                "--dry-run",
                "--workloads",
                "longtail",
                "--max-points",
                "1",
                "--num-batches",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "barrier" in out and "per_env_sync" in out and "x 2" in out


def test_schedulers_flag_runs_only_the_named_ones_where_a_point_has_them(capsys):
    assert (
        main(
            [
                "--dry-run",
                "--workloads",
                "longtail",
                "--schedulers",
                "per_env_first_complete",
            ]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    # Only the headline point lists first_complete; the points that name their own schedulers do not get it.
    assert len(lines) == 1 and "8x8 W16 per_env_first_complete" in lines[0]


def test_headline_quotes_per_env_vs_barrier_and_vs_ceiling():
    rows = [
        {
            "workload": "longtail",
            "point": "8x8 W16",
            "num_envs": 64,
            "scheduler": "per_env",
            "speedup_vs_barrier": 3.0,
            "token_speedup_vs_barrier": 2.5,
            "tokens_vs_ceiling": 0.4,
        },
        {
            "workload": "longtail",
            "point": "8x8 W16",
            "num_envs": 64,
            "scheduler": "barrier",
            "speedup_vs_barrier": 1.0,
            "token_speedup_vs_barrier": 1.0,
            "tokens_vs_ceiling": 0.1,
        },
    ]
    (line,) = headline({"rows": rows})
    assert (
        "**3.00x**" in line
        and "per-env ÷ ceiling: **0.40**" in line
        and "barrier ÷ ceiling: 0.10" in line
    )


def test_engine_step_figures_split_tokens_per_second_into_step_rate_and_tokens_per_step():
    from benchmarks.env_grouping import (
        RunOutput,
        engine_step_figures,
        engine_step_notes,
        pool_runs,
    )

    before = {
        "engine_steps": 100,
        "engine_step_generation_tokens": 5000,
        "engine_step_running_sum": 5200,
        "generation_tokens": 1,
    }
    after = {
        "engine_steps": 400,
        "engine_step_generation_tokens": 20000,
        "engine_step_running_sum": 20800,
        "generation_tokens": 2,
    }
    notes = engine_step_notes(before, after)
    assert notes == {
        "engine_steps": 300.0,
        "engine_step_generation_tokens": 15000.0,
        "engine_step_running_sum": 15600.0,
    }
    figures = engine_step_figures(notes, wall_s=6.0)
    assert figures == {
        "engine_steps_per_s": 50.0,
        "generation_tokens_per_step": 50.0,
        "running_per_step": 52.0,
    }
    # steps/s x tokens per step is the engine's generated tokens/s over the window
    assert (
        figures["engine_steps_per_s"] * figures["generation_tokens_per_step"]
        == 15000 / 6.0
    )
    # repeats pool by adding counts and wall time: the pooled figures are the ratios of the sums
    run = RunOutput(
        trajectories=[],
        wall_s=6.0,
        windows=[],
        waits=[],
        samples=[],
        engine_tokens=0.0,
        notes=dict(notes),
    )
    pooled = pool_runs(
        [
            run,
            RunOutput(
                **{
                    **vars(run),
                    "wall_s": 4.0,
                    "notes": {k: v / 3 for k, v in notes.items()},
                }
            ),
        ]
    )
    assert (
        engine_step_figures(pooled.notes, pooled.wall_s)["engine_steps_per_s"]
        == 400 / 10.0
    )
    # an engine without the counters (a fake engine, an older build) gives no figures rather than wrong ones
    assert engine_step_notes({"generation_tokens": 1}, {"generation_tokens": 2}) == {}
    assert engine_step_figures({}, wall_s=6.0) == {}
