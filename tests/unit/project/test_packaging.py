"""The wheel holds one import package, roll_async, with the two mapped root folders inside it,
and its ``py.typed`` marker."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_wheel_installs_exactly_one_top_level_package(tmp_path):
    # Build from a copy of the files git would ship: a build/ folder left in the checkout
    # keeps files that no longer exist, and setuptools would put them in the wheel.
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in listed:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps"]
        + ["--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("roll_async-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"roll_async"}, top_level
    for shipped in (
        "roll_async/pipelines/agentic_pipeline.py",
        "roll_async/env_managers/worker.py",
        "roll_async/testing/fake_engine.py",
        "roll_async/envs/data/retrieval_qa.json",
        "roll_async/report/page.html",
        "roll_async/py.typed",  # PEP 561: type checkers read the package's hints
    ):
        assert shipped in names, shipped
