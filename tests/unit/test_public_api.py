"""The public API: ``roll_async.__all__`` resolves, ``import roll_async`` stays cheap, and the public
callables' docstrings carry the structured sections docs/api-reference.md shows."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import roll_async
from roll_async.api_reference import parse_docstring

#: Packages ``import roll_async`` must not load: heavy, or only in some installs.
HEAVY = ("vllm", "ray", "torch", "transformers", "omegaconf", "numpy", "PIL")


@pytest.mark.parametrize("name", roll_async.__all__)
def test_every_public_name_resolves_and_is_documented(name):
    obj = getattr(roll_async, name)
    assert obj.__name__ == name, f"roll_async.{name} is {obj!r}"
    assert inspect.getdoc(obj), f"roll_async.{name} has no docstring"


def test_the_public_names_are_listed_once_and_star_import_gives_them():
    assert len(set(roll_async.__all__)) == len(roll_async.__all__)
    namespace: dict[str, object] = {}
    exec("from roll_async import *", namespace)
    assert set(roll_async.__all__) <= set(namespace)
    assert set(roll_async.__all__) <= set(dir(roll_async))


def test_an_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = roll_async.no_such_name


def test_importing_the_package_loads_no_heavy_or_optional_package():
    # A fresh interpreter: this one has already imported them for other tests.
    code = (
        "import sys, roll_async; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert not loaded, f"`import roll_async` loaded {loaded}; load them on first use"


def _public_callables() -> list[tuple[str, object]]:
    """Public functions, and the public methods of the env contract, that take arguments."""
    found: list[tuple[str, object]] = []
    for name in roll_async.__all__:
        obj = getattr(roll_async, name)
        if inspect.isfunction(obj):
            found.append((name, obj))
    for method in ("reset", "step"):
        found.append((f"BaseEnv.{method}", getattr(roll_async.BaseEnv, method)))
    return found


@pytest.mark.parametrize(
    "name, function", _public_callables(), ids=[n for n, _ in _public_callables()]
)
def test_public_callables_document_their_arguments_and_result(name, function):
    doc = parse_docstring(inspect.getdoc(function))
    params = [p for p in inspect.signature(function).parameters if p != "self"]
    documented = [key for key, _ in doc.sections.get("Args", [])]
    assert documented == params, (
        f"roll_async.{name}: its docstring's Args: section lists {documented}, "
        f"the signature has {params}; write one `name: meaning` line per argument"
    )
    assert doc.sections.get("Returns"), (
        f"roll_async.{name}: add a Returns: section to its docstring"
    )
