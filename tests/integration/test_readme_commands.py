"""The main job as the README shows it, run for real, and what the README does with its run directory.

``bash scripts/main.sh`` (one step), ``report``, ``export`` then ``check-model`` on the export, ``export
--step`` and training on the export as "your own model"; helpers and the command list in readme_runs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.readme_runs import (
    SHORT,
    SHORT_SFT,
    assert_trained,
    cli,
    main_sh,
    metrics,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# -- the main job, its report, export and check-model -----------------------------------------------


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("readme") / "tour"
    out = main_sh(*SHORT, *SHORT_SFT, f"output_dir={run}")
    return {"run": run, "out": out}


def test_main_job_trains_one_step_and_checkpoints(main_job):
    run = main_job["run"]
    (trained,) = assert_trained(main_job["out"], run)
    sft = [m for m in metrics(run) if m["step"] == -1]
    assert sft and any(k.startswith("sft/") for k in sft[0]), "the SFT warm start ran"
    assert "mode: sync" in (run / "config.yaml").read_text()
    assert (run / "trajectories.jsonl").read_text().count("\n") == 8


def test_report_of_the_main_job(main_job):
    out = cli("report", str(main_job["run"]))
    assert (main_job["run"] / "report.html").is_file(), out


@pytest.fixture(scope="module")
def exported(main_job, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("readme") / "exported"
    out = cli("export", str(main_job["run"]), "--out", str(out_dir))
    assert str(out_dir) in out
    return out_dir


def _check_rows(out: str) -> dict[str, str]:
    """check-model's table: check name -> status, from the rows under its dashed header line."""
    lines = out.splitlines()
    header = next(
        i for i, line in enumerate(lines) if re.fullmatch(r"-+ +-+ +-+", line)
    )
    rows = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        name, status, *_ = re.split(r"\s{2,}", line.strip())
        rows[name] = status
    return rows


def test_export_then_check_model_on_the_export(exported):
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))
    out = cli("check-model", str(exported), "--temperature", "0.7", "--top-p", "0.9")
    rows = _check_rows(out)
    assert {
        "transformers load",
        "vLLM load",
        "token-in/token-out",
        "weight sync round trip",
    } <= set(rows), out[-3000:]
    assert set(rows.values()) <= {"ok", "info"}, rows
    assert f"{exported}: all checks passed" in out
    # one row per check: the engine's own INFO lines stay out of the console
    assert not re.search(r"^\(\w+ pid=\d+\) INFO", out, re.M), out[:3000]


def test_export_of_a_named_step(main_job, tmp_path):
    out_dir = tmp_path / "step0"
    cli("export", str(main_job["run"]), "--step", "0", "--out", str(out_dir))
    assert (out_dir / "config.json").is_file() and list(out_dir.glob("*.safetensors"))


def test_train_on_your_own_model(exported, tmp_path):
    """Bring your own model: Sokoban on a Hugging Face directory (the main job's export)."""
    run = tmp_path / "own-model"
    out = cli(
        "train",
        "configs/sokoban.yaml",
        f"model.path={exported}",
        *SHORT,
        f"output_dir={run}",
    )
    assert_trained(out, run)
    assert f"path: {exported}" in (run / "config.yaml").read_text()
