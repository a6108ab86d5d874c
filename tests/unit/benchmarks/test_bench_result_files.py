"""Benchmark outputs: written under the name given, plots only when asked, never over a recorded result unasked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import benchmarks.common as common
from benchmarks import env_grouping, scale_sim
from benchmarks.common import ResultExistsError, ResultFiles


@pytest.fixture
def results_dir(tmp_path, monkeypatch) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    monkeypatch.setattr(common, "RESULTS_DIR", out)
    return out


@pytest.fixture
def calibration(tmp_path) -> str:
    path = tmp_path / "ceiling.json"
    path.write_text(
        json.dumps(
            {
                "rows": [
                    {"concurrency": 1, "decode_step_s": 0.003},
                    {"concurrency": 64, "decode_step_s": 0.01},
                ]
            }
        )
    )
    return str(path)


@pytest.fixture
def fake_children(monkeypatch) -> list[list[str]]:
    """scale_sim's per-env-count subprocesses, replaced by one that writes a small row."""
    calls: list[list[str]] = []

    def run(cmd, check, cwd):
        calls.append(cmd)
        n = int(cmd[cmd.index("--child") + 1])
        row = {
            "num_envs": n,
            "scheduler_cpu_us_per_trajectory": 800.0,
            "scheduler_cpu_us_per_turn": 350.0,
            "rss_kb_per_env_peak": 39.0,
            "rss_kb_per_env_built": 20.0,
        }
        Path(cmd[cmd.index("--child-out") + 1]).write_text(json.dumps(row))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(scale_sim.subprocess, "run", run)
    monkeypatch.setattr(scale_sim, "to_markdown", lambda result: "simulated\n")
    return calls


def test_result_files_refuse_an_existing_file_and_name_it(tmp_path):
    (tmp_path / "run.md").write_text("recorded")
    with pytest.raises(ResultExistsError, match=r"run\.md exists; pass --overwrite"):
        ResultFiles("run", [".json", ".md"], results_dir=tmp_path)
    with pytest.raises(SystemExit) as exited:
        ResultFiles.claim("run", [".json", ".md"], results_dir=tmp_path)
    message = str(exited.value.code)
    assert "\n" not in message and "run.md" in message and "--overwrite" in message
    assert (tmp_path / "run.md").read_text() == "recorded"

    out = ResultFiles("run", [".json", ".md"], overwrite=True, results_dir=tmp_path)
    out.write_text(".md", "new")
    assert (tmp_path / "run.md").read_text() == "new"
    saved = json.loads(out.write_json({"x": 1}).read_text())
    assert saved["x"] == 1 and {"recorded_at", "command", "machine"} <= set(saved)
    with pytest.raises(KeyError, match="not claimed"):
        out.path(".png")


def test_write_json_refuses_to_replace_a_file_unless_asked(tmp_path):
    common.write_json("r", {"a": 1}, tmp_path)
    with pytest.raises(ResultExistsError):
        common.write_json("r", {"a": 2}, tmp_path)
    common.write_json("r", {"a": 2}, tmp_path, overwrite=True)
    assert json.loads((tmp_path / "r.json").read_text())["a"] == 2


def test_grouping_simulate_writes_under_the_given_name_without_plots(
    results_dir, calibration, fake_children
):
    """`env_grouping --simulate --name X --no-plots` once wrote scale_sim_cpu.* with plots, whatever it was told."""
    (results_dir / "scale_sim_cpu.json").write_text("recorded")
    argv = ["--simulate", "--envs", "10", "20", "--repeats", "2", "--name", "mine"]
    argv += ["--no-plots", "--calibration", calibration]
    assert env_grouping.main(argv) == 0
    assert sorted(p.name for p in results_dir.iterdir()) == [
        "mine.csv",
        "mine.json",
        "mine.md",
        "scale_sim_cpu.json",
    ]
    assert (results_dir / "scale_sim_cpu.json").read_text() == "recorded"
    # --repeats reached the simulation too: two env counts, two runs each.
    assert len(fake_children) == 4
    rows = json.loads((results_dir / "mine.json").read_text())["rows"]
    assert sorted(r["num_envs"] for r in rows) == [10, 10, 20, 20]


@pytest.mark.parametrize("via_grouping", [False, True])
def test_simulation_refuses_before_running_if_its_file_exists(
    results_dir, calibration, fake_children, via_grouping, capsys
):
    (results_dir / "scale_sim_cpu.md").write_text("recorded")
    argv = ["--envs", "10", "--no-plots", "--calibration", calibration]
    main = scale_sim.main
    if via_grouping:
        argv, main = ["--simulate", *argv], env_grouping.main
    with pytest.raises(SystemExit) as exited:
        main(argv)
    message = str(exited.value.code)
    assert "scale_sim_cpu.md exists" in message and "--overwrite" in message
    assert fake_children == []  # refused before the first simulated run
    assert (results_dir / "scale_sim_cpu.md").read_text() == "recorded"

    assert main([*argv, "--overwrite"]) == 0
    assert (results_dir / "scale_sim_cpu.md").read_text() == "simulated\n"


def test_every_benchmark_takes_the_same_output_flags():
    """Each benchmark's --help lists --name and --overwrite (and the plotting ones --no-plots)."""
    repo = Path(__file__).resolve().parents[3]
    modules = {
        "async_speedup": False,
        "engine_ceiling": False,
        "env_grouping": True,
        "env_server_load": False,
        "learning_demo": True,
        "ray_call_cost": False,
        "scale_sim": True,
        "weight_sync": False,
    }
    for module, plots in modules.items():
        source = (repo / "benchmarks" / f"{module}.py").read_text()
        assert "add_output_args(" in source, module
        assert ("plots=True" in source) == plots, module
        assert "write_json(" not in source.replace(".write_json(", ""), module


def test_peak_rss_is_this_process_s_own_and_can_be_reset():
    # ru_maxrss survives execve, so a spawned rank reported its parent's peak; VmHWM is the process's own
    import multiprocessing

    from benchmarks.common import peak_rss_bytes

    ballast = bytearray(256 << 20)  # this process's peak is now at least 256 MiB
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        child_peak = pool.apply(peak_rss_bytes)
    with_ballast = peak_rss_bytes()
    assert child_peak < with_ballast - (200 << 20)
    del ballast  # a large allocation goes back to the system when freed
    assert peak_rss_bytes(reset=True) < with_ballast - (200 << 20)
