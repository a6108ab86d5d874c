"""benchmarks/selfplay_demo.py: a run's start and end validation read back, and the scripted players' scale."""

from __future__ import annotations

import json

import pytest

from benchmarks.selfplay_demo import (
    VAL_TAGS,
    markdown,
    scripted_win_rates,
    summarise_run,
    train_command,
)


def _val_row(step: int, first: float, second: float) -> dict:
    row: dict = {"step": step, "val/num_episodes": 64.0}
    for tag, win in zip(VAL_TAGS, (first, second)):
        row |= {
            f"val/{tag}/game_win": win,
            f"val/{tag}/game_loss": 1 - win,
            f"val/{tag}/game_draw": 0.0,
            f"val/{tag}/game_invalid_move": 0.0,
        }
    return row


def test_a_run_reads_back_its_start_and_end_validation(tmp_path):
    rows = [
        {"step": -1, "sft/loss/last": 0.12},
        _val_row(-1, 0.375, 0.25),
        {"step": 0, "train/loss": 0.1},
        _val_row(39, 0.75, 0.5),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run = summarise_run(tmp_path)
    assert run["start"]["step"] == -1 and run["end"]["step"] == 39
    assert run["start"]["win_rate"] == pytest.approx(0.3125)
    assert run["end"]["win_rate"] == pytest.approx(0.625)
    assert run["sft_loss_last"] == pytest.approx(0.12)
    payload = {
        "recorded_at": "now",
        "machine": {"cpu_model": "cpu", "cpu_count": 2},
        "load_average": {"before": [0.0], "after": [0.0]},
        "command": "python -m benchmarks.selfplay_demo",
        "runs": {"1": {**run, "wall_s": 60.0}},
        "summary": {
            "start_win_rate": {"n": 1, "median": 0.3125, "min": 0.3125, "max": 0.3125},
            "end_win_rate": {"n": 1, "median": 0.625, "min": 0.625, "max": 0.625},
            "seeds_improved": 1,
        },
        "scripted_win_rates": {"games": 10, "random": [0.5, 0.5], "heuristic": [1, 1]},
    }
    text = markdown(payload)
    assert "the same 64 seeded games (32 moving first, 32 second" in text
    assert "| 1 | 0.312 | 0.625 |" in text


def test_a_run_without_start_validation_is_refused_naming_the_setting(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_val_row(39, 0.5, 0.5)))
    with pytest.raises(SystemExit, match="eval_at_start: true"):
        summarise_run(tmp_path)


def test_the_scripted_scale_separates_the_heuristic_from_the_random_player():
    rates = scripted_win_rates(games=200)
    assert all(0.35 < r < 0.65 for r in rates["random"])
    assert all(r > 0.9 for r in rates["heuristic"])


def test_each_seed_is_one_train_command_with_its_overrides(tmp_path):
    command = train_command(3, 10, tmp_path / "seed3", ["trainer.lr=1e-3"])
    assert command[-1] == "trainer.lr=1e-3"
    assert {"seed=3", "max_steps=10", "eval_steps=10"} <= set(command)
