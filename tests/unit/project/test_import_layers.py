"""The rooms import downwards only, never in a circle, never the test aids
(tests/import_layers.py; .ci/run runs the same check after ruff)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_layers import REPO, check, mapped_folders, source_modules

#: A small package for the checker's own tests: ``top`` and ``entry`` over ``mid`` and
#: ``side`` over ``low``, the package's ``__init__`` in the top layer, as in the real LAYERS.
LAYERS = (("roll_async", "top", "entry"), ("mid", "side"), ("low",))
MAPPED = {"roll_async.outside": "outside"}


def make_package(root: Path, files: dict[str, str]) -> Path:
    """A repository holding roll_async (rooms top, entry, mid, side, low and testing) that keeps
    LAYERS, with ``files`` written over it."""
    base = {
        "roll_async/__init__.py": "from roll_async.low import Error\n",
        "roll_async/top.py": "from roll_async.mid import run\n",
        "roll_async/entry.py": "def main():\n    pass\n",
        "roll_async/mid/__init__.py": "",
        "roll_async/mid/run.py": "from roll_async import low\nfrom roll_async.side import x\n",
        "roll_async/side/__init__.py": "x = 1\n",
        "roll_async/low.py": "class Error(Exception):\n    pass\n",
        "roll_async/testing/__init__.py": "from roll_async.top import run\n",
    }
    for name, text in (base | files).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_package_keeps_its_layers():
    problems = check()
    assert not problems, "\n".join(problems)


def test_the_mapped_folders_are_read_from_setup_py_and_checked():
    mapped = mapped_folders(REPO)
    assert mapped == {
        "roll_async.pipelines": "pipelines",
        "roll_async.env_managers": "env_managers",
    }
    modules = source_modules(REPO, mapped)
    assert modules["roll_async.env_managers.worker"] == REPO / "env_managers/worker.py"
    assert modules["roll_async.pipelines"] == REPO / "pipelines/__init__.py"


def test_a_kept_package_passes(tmp_path):
    assert check(make_package(tmp_path, {}), LAYERS, mapped={}) == []


@pytest.mark.parametrize(
    "text, line",
    [
        ("import os\nfrom roll_async.entry import main\n", 2),
        ("def late():\n    import roll_async.entry\n", 2),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from roll_async.entry import main\n",
            3,
        ),
        ("from roll_async import Error\n", 1),  # a public name: the package's __init__
    ],
    ids=["module-top", "in-a-function", "type-checking", "package-init"],
)
def test_an_import_of_a_higher_layer_fails_naming_the_line(tmp_path, text, line):
    repo = make_package(tmp_path, {"roll_async/mid/late.py": text})
    (problem,) = check(repo, LAYERS, mapped={})
    assert problem.startswith(
        f"roll_async/mid/late.py:{line}: roll_async.mid.late imports roll_async"
    )
    room = "roll_async" if "import Error" in text else "entry"
    assert f"room 'mid' (layer 2) imports {room!r} of the higher layer 1;" in problem


def test_a_relative_import_is_resolved(tmp_path):
    repo = make_package(
        tmp_path, {"roll_async/side/inner.py": "from ..mid import run\n"}
    )
    (problem,) = check(repo, LAYERS, mapped={})
    assert problem.startswith(
        "rooms import each other in a circle: mid -> side "
        "(roll_async/mid/run.py:2) -> mid (roll_async/side/inner.py:1);"
    )


def test_rooms_of_one_layer_may_not_import_each_other_in_a_circle(tmp_path):
    repo = make_package(
        tmp_path, {"roll_async/side/__init__.py": "import roll_async.mid\n"}
    )
    (problem,) = check(repo, LAYERS, mapped={})
    assert problem.startswith(
        "rooms import each other in a circle: mid -> side "
        "(roll_async/mid/run.py:2) -> mid (roll_async/side/__init__.py:1);"
    )


def test_library_code_never_imports_the_test_aids(tmp_path):
    repo = make_package(
        tmp_path, {"roll_async/mid/aid.py": "from roll_async.testing import run\n"}
    )
    (problem,) = check(repo, LAYERS, mapped={})
    assert problem.startswith(
        "roll_async/mid/aid.py:1: roll_async.mid.aid imports roll_async.testing: "
        "library code never imports the test aids"
    )


def test_a_room_in_no_layer_fails(tmp_path):
    # a module, and a folder without __init__.py: both are rooms
    repo = make_package(
        tmp_path, {"roll_async/extra.py": "", "roll_async/loose/a.py": ""}
    )
    assert check(repo, LAYERS, mapped={}) == [
        f"roll_async/{path}: room {room!r} is in no layer and is not 'testing': add it "
        "to a layer (see LAYERS in tests/import_layers.py and docs/architecture.md)"
        for path, room in (("extra.py", "extra"), ("loose/a.py", "loose"))
    ]


def test_a_mapped_folder_is_checked_as_its_room(tmp_path):
    repo = make_package(
        tmp_path, {"outside/__init__.py": "", "outside/w.py": "x = 1\n"}
    )
    layers = (*LAYERS[:-1], ("low", "outside"))
    assert check(repo, layers, mapped=MAPPED) == []
    (tmp_path / "outside/w.py").write_text("from roll_async.top import run\n")
    (problem,) = check(repo, layers, mapped=MAPPED)
    assert problem.startswith(
        "outside/w.py:1: roll_async.outside.w imports roll_async.top: room 'outside'"
    )
