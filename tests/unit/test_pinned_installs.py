"""The CPU install is pinned: the project's direct dependencies are installed at constraints.txt's versions."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "constraints.txt"
MOVE_THE_LOCK = (
    "To move the lock deliberately: install the new version into .venv, run the suite (bash scripts/test.sh), "
    "then `bash scripts/lock.sh` and commit constraints.txt. To return .venv to the lock: "
    "`rm .venv/.roll_async_stamp && bash scripts/setup.sh`."
)


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _direct_requirements() -> list[Requirement]:
    """pyproject's dependencies plus the extras scripts/setup.sh installs on CPU."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    setup = (REPO / "scripts" / "setup.sh").read_text()
    extras = re.search(r"\[\$device,([\w,]+)\]", setup).group(1).split(",")
    listed = list(project["dependencies"])
    for extra in ["cpu", *extras]:
        listed += project["optional-dependencies"][extra]
    return [Requirement(text) for text in listed]


def _installed_by_setup_on_cpu() -> bool:
    stamp = Path(sys.prefix) / ".roll_async_stamp"
    return stamp.is_file() and stamp.read_text().startswith("cpu ")


def test_the_lock_satisfies_pyproject():
    pins = _lock()
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, (
            f"{requirement.name} is not in constraints.txt. {MOVE_THE_LOCK}"
        )
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}. {MOVE_THE_LOCK}"
        )


@pytest.mark.skipif(
    not _installed_by_setup_on_cpu(),
    reason="this environment was not installed by scripts/setup.sh on CPU (only that install is pinned)",
)
def test_direct_dependencies_are_installed_at_the_locked_versions():
    pins = _lock()
    wrong = []
    for requirement in _direct_requirements():
        name = canonicalize_name(requirement.name)
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "(not installed)"
        if installed != pins.get(name):
            wrong.append(f"{name}: installed {installed}, locked {pins.get(name)}")
    assert not wrong, f"{'; '.join(wrong)}. {MOVE_THE_LOCK}"
