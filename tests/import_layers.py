"""The import layers of roll_async, checked: each room imports only rooms of its own or a
lower layer, no two rooms import each other in a circle, and no library room imports
``roll_async.testing``.

A room is a subpackage (``roll_async/engine``) or a top-level module
(``roll_async/trajectory.py``) of the one import package. Every import statement counts,
at a module's top, inside a function or under ``TYPE_CHECKING``: each one is a dependency
a reader follows. Imports by string (``importlib.import_module``) are not seen.

This reads the source with ``ast`` rather than running import-linter: its graph builder
(grimp) walks the ``roll_async/`` folder and cannot see ``pipelines/`` and
``env_managers/``, which setup.py maps into the package from the repository's root.

Run ``python -m tests.import_layers`` from the repository root (.ci/run does, after
ruff); tests/unit/project/test_import_layers.py runs the same check in the test suite.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "roll_async"

#: The layers, highest first (docs/architecture.md, "The rooms"). A room may import the
#: rooms of lower layers, and rooms of its own layer as long as no circle forms; never a
#: room of a higher layer. ``roll_async`` is the package's ``__init__``: the public names.
LAYERS: tuple[tuple[str, ...], ...] = (
    # entry points: the console command, the API reference generator, the public names
    ("cli", "api_reference", PACKAGE),
    # composition: the pipelines, and the report that reads what they write
    ("pipelines", "report"),
    # the rollout loop: the scheduler drives the env managers' episode loops
    ("scheduler", "env_managers"),
    # what the loop drives: generation, training, rewards, models, env hosting, agents
    ("engine", "trainer", "rewards", "model", "env_service", "agent_gateway"),
    # building blocks
    ("envs", "workspaces", "prompts", "runtime", "run_output"),
    # shared types and settings
    ("config", "trajectory", "metrics", "sampling"),
    # the errors every room raises
    ("errors",),
)

#: Test aids: they may import any room, and no room in LAYERS imports them.
TEST_AIDS = "testing"

FIX = "see LAYERS in tests/import_layers.py and docs/architecture.md"


@dataclass(frozen=True)
class Import:
    """One import statement's edge from a module to a module of the package."""

    source: str
    target: str
    path: Path
    line: int

    def where(self, repo: Path) -> str:
        """``file:line`` relative to the repository, as a reader opens it."""
        return f"{self.path.relative_to(repo)}:{self.line}"


def mapped_folders(repo: Path) -> dict[str, str]:
    """setup.py's ``MAPPED_FOLDERS`` (package name -> root folder), read without running it."""
    tree = ast.parse((repo / "setup.py").read_text(), filename="setup.py")
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MAPPED_FOLDERS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py: no MAPPED_FOLDERS assignment; the layer check reads it")


def source_modules(repo: Path, mapped: Mapping[str, str]) -> dict[str, Path]:
    """Every module of the package (dotted name -> file), the mapped folders included."""
    roots = {PACKAGE: repo / PACKAGE} | {
        name: repo / folder for name, folder in mapped.items()
    }
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> Iterable[Import]:
    """The package modules that ``name``'s import statements reach (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` names the submodule when there is one
            targets = [
                f"{module}.{alias.name}"
                if f"{module}.{alias.name}" in modules
                else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                yield Import(name, target, path, node.lineno)


def room_of(module: str) -> str:
    """The room a module belongs to: the first name below the package, or the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def _circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """One shortest circle through each group of rooms that import each other.

    Each circle is the rooms in import order, its first room repeated at the end.
    """
    reach = {room: _reachable(edges, room) for room in edges}
    groups = {
        frozenset(r for r in reach[room] if room in reach.get(r, ())) | {room}
        for room in edges
        if room in reach[room]
    }
    return [
        min(
            (_shortest_path(edges, room, room) for room in sorted(group)),
            key=len,
        )
        for group in sorted(groups, key=sorted)
    ]


def _reachable(edges: Mapping[str, set[str]], start: str) -> set[str]:
    """The rooms reached from ``start`` by one import or more."""
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        room = todo.pop()
        if room not in seen:
            seen.add(room)
            todo.extend(edges.get(room, ()))
    return seen


def _shortest_path(edges: Mapping[str, set[str]], start: str, end: str) -> list[str]:
    """The fewest imports from ``start`` to ``end`` (breadth first), both ends included."""
    paths = [[start]]
    seen: set[str] = set()
    while paths:
        path = paths.pop(0)
        for room in sorted(edges.get(path[-1], ())):
            if room == end:
                return [*path, room]
            if room not in seen:
                seen.add(room)
                paths.append([*path, room])
    raise ValueError(f"no import path from {start} to {end}")


def check(
    repo: Path = REPO,
    layers: Sequence[Sequence[str]] = LAYERS,
    mapped: Mapping[str, str] | None = None,
) -> list[str]:
    """Every broken rule, one line each naming the file:line and the rooms; empty when kept."""
    modules = source_modules(repo, mapped_folders(repo) if mapped is None else mapped)
    layer_of = {room: depth for depth, rooms in enumerate(layers) for room in rooms}
    rooms: dict[str, Path] = {}
    for module, path in modules.items():
        rooms.setdefault(room_of(module), path)
    problems = [
        f"{path.relative_to(repo)}: room {room!r} is in no layer and is not "
        f"{TEST_AIDS!r}: add it to a layer ({FIX})"
        for room, path in rooms.items()
        if room not in layer_of and room != TEST_AIDS
    ]
    edges: dict[str, set[str]] = {}
    first_seen: dict[tuple[str, str], Import] = {}
    for module, path in modules.items():
        for imp in _imports_of(module, path, modules):
            source, target = room_of(imp.source), room_of(imp.target)
            if source == target:
                continue
            first_seen.setdefault((source, target), imp)
            if target == TEST_AIDS:  # not an edge: no room may import it at all
                problems.append(
                    f"{imp.where(repo)}: {imp.source} imports {imp.target}: library "
                    f"code never imports the test aids; move what it needs into the "
                    f"library"
                )
                continue
            edges.setdefault(source, set()).add(target)
            if (
                source in layer_of
                and target in layer_of
                and layer_of[target] < layer_of[source]
            ):
                problems.append(
                    f"{imp.where(repo)}: {imp.source} imports {imp.target}: room "
                    f"{source!r} (layer {layer_of[source] + 1}) imports {target!r} of "
                    f"the higher layer {layer_of[target] + 1}; move the shared code "
                    f"down a layer ({FIX})"
                )
    for circle in _circles(edges):
        arrows = " -> ".join(
            [circle[0]]
            + [
                f"{b} ({first_seen[a, b].where(repo)})"
                for a, b in zip(circle, circle[1:])
            ]
        )
        problems.append(
            f"rooms import each other in a circle: {arrows}; break one arrow so the "
            f"rooms can be layered ({FIX})"
        )
    return problems


def main() -> int:
    problems = check()
    for line in problems:
        print(f"[layers] {line}", file=sys.stderr)
    if problems:
        print(f"[layers] {len(problems)} broken import rule(s)", file=sys.stderr)
        return 1
    print(f"[layers] ok: {' > '.join(' '.join(rooms) for rooms in LAYERS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
