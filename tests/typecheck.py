"""mypy over the one import package as setup.py lays it out: ``pipelines/`` and ``env_managers/`` are
checked as ``roll_async.pipelines`` and ``roll_async.env_managers``.

Plain ``mypy -p roll_async`` finds modules by folder, and the editable install maps the two root folders into
the package with an import hook that mypy does not run, so it would miss them and fail on every import of
them. This passes mypy each module with its dotted name (the list tests/import_layers.py reads). The options
are pyproject.toml's ``[tool.mypy]``; arguments are passed on to mypy (``--no-incremental``, ``--cache-dir``).

Run ``python -m tests.typecheck`` from the repository root (.ci/run does, after ruff).
"""

from __future__ import annotations

import os
import sys
import time

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource
from mypy.util import count_stats, hard_exit

from tests.import_layers import PACKAGE, REPO, mapped_folders, source_modules


def sources() -> list[BuildSource]:
    """Every module of the package under its installed name, with its path relative to the repository."""
    return [
        BuildSource(os.path.relpath(path, REPO), name, None, str(REPO))
        for name, path in source_modules(REPO, mapped_folders(REPO)).items()
    ]


def main(args: list[str]) -> int:
    start = time.monotonic()
    fscache = FileSystemCache()
    # The package's __init__ stands in for the targets so that mypy reads the config and flags; the
    # module list below replaces it.
    _, options = process_options(
        [*args, os.path.join(PACKAGE, "__init__.py")], fscache=fscache
    )
    messages: list[str] = []

    def show(_file: str | None, new: list[str], serious: bool) -> None:
        messages.extend(new)
        if new:
            print(
                "\n".join(new), file=sys.stderr if serious else sys.stdout, flush=True
            )

    modules = sources()
    blocked = False
    try:
        build.build(modules, options, None, show, fscache, sys.stdout, sys.stderr)
    except CompileError:
        blocked = True
    errors, notes, files = count_stats(messages)
    took = f"{time.monotonic() - start:.0f} s"
    if errors or blocked:
        print(
            f"[mypy] {errors} error(s) in {files} file(s) ({len(modules)} modules checked, {took})"
        )
        return 2 if blocked else 1
    print(f"[mypy] ok: no issues in {len(modules)} modules ({took})")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    # As mypy's own command does: exit without freeing the build's objects (that takes as long as the check).
    hard_exit(main(sys.argv[1:]))
