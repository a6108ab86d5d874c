"""Python packages for the local runtime's sandbox: a copy every uid can read, compiled once.

The task image has python3 with pytest; on a host the interpreter that has pytest may live where the
sandbox's unprivileged uids cannot read (``/root/.pyenv``), so the local runtime copies the packages
a task needs (pytest and what it requires) into one world-readable folder under its root, puts it on
``PYTHONPATH`` and ``PATH`` (a ``bin/pytest`` shim), and byte-compiles it so no run pays for that.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import os
import secrets
import shutil
from pathlib import Path

from roll_async.errors import ConfigError


def python_tools(root: str, packages: tuple[str, ...]) -> str:
    """A world-readable folder with ``python_packages`` and their dependencies, and a ``bin/pytest``."""
    names = sorted(_with_requirements(packages))
    tag = "-".join(f"{n}{importlib.metadata.version(n)}" for n in names) or "none"
    folder = os.path.join(root, f"pylib-{tag}")
    if os.path.isdir(folder):
        return folder
    staging = f"{folder}.{os.getpid()}.{secrets.token_hex(4)}"
    for name in names:
        dist = importlib.metadata.distribution(name)
        for file in dist.files or ():
            if "__pycache__" in file.parts or file.parts[0].startswith(".."):
                continue
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                target = Path(staging, *file.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
    os.makedirs(os.path.join(staging, "bin"), exist_ok=True)
    shim = os.path.join(staging, "bin", "pytest")
    with open(shim, "w", encoding="utf-8") as handle:
        handle.write('#!/bin/sh\nexec python3 -m pytest "$@"\n')
    # compiled once here: the sandbox's uids cannot write __pycache__, and compiling pytest on every run costs seconds
    compileall.compile_dir(staging, quiet=2, workers=1)
    for top, _dirs, files in os.walk(staging):
        os.chmod(top, 0o755)
        for name in files:
            os.chmod(os.path.join(top, name), 0o755 if top.endswith("/bin") else 0o644)
    try:
        os.rename(staging, folder)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _with_requirements(packages: tuple[str, ...]) -> set[str]:
    """The installed distributions ``packages`` need, themselves included (markers that do not apply are skipped)."""
    from packaging.requirements import Requirement  # noqa: PLC0415 (pytest's own dependency)

    seen: set[str] = set()
    todo = list(packages)
    while todo:
        name = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise ConfigError(
                f"local runtime python_packages: {name!r} is not installed in this interpreter"
            ) from exc
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen
