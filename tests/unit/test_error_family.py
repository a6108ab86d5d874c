"""One error family: the library raises subclasses of ``RollAsyncError`` (roll_async/errors.py), so a caller's
``except RollAsyncError`` sees every roll-async failure, and a new bare ``raise ValueError(...)`` fails here.

The walk reads every module of the package with ``ast`` (roll_async/ and the folders setup.py maps
into it, each file once). A built-in stays only where Python's protocols make it the contract; each
rule below says which, and why.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.import_layers import REPO, mapped_folders, source_modules

#: The names of Python's built-in exception classes (``ValueError``, ``RuntimeError``, ...).
BUILTIN_EXCEPTIONS: frozenset[str] = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)

#: Rule: these are how a process exits or is interrupted, not failures; allowed anywhere.
EXIT_PROTOCOL: frozenset[str] = frozenset(
    {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}
)

#: Rule: a dunder of Python's data model (``__getattr__``, ``__getitem__``, ``__eq__``, ...) answers with
#: the built-in its protocol names: ``getattr``/``hasattr``, ``in``, iteration and ``==`` catch exactly it.
PROTOCOL_EXCEPTIONS: frozenset[str] = frozenset(
    {
        "AttributeError",
        "KeyError",
        "IndexError",
        "LookupError",
        "TypeError",
        "StopIteration",
        "StopAsyncIteration",
        "NotImplementedError",
    }
)

#: The dunders that construct or call an object: their errors are ordinary failures, not a protocol's answer.
NOT_PROTOCOL_DUNDERS: frozenset[str] = frozenset(
    {"__init__", "__post_init__", "__new__", "__init_subclass__", "__call__"}
)

#: Rule: a stand-in for foreign code (a user's env or agent) raises what that code would, so the
#: library's handling of a foreign failure is what the tests see. ``file::function`` -> why.
SIMULATED_FOREIGN_FAILURES: dict[str, str] = {
    "roll_async/testing/agents.py::raising_agent": "plays a user agent's bug",
    "roll_async/testing/workspace_agents.py::raising_agent": "plays a user shell agent's bug",
    "roll_async/testing/scripted_envs.py::ScriptedEnv._maybe_fail": "plays a user env's crash",
    "roll_async/testing/scripted_envs.py::ScriptedEnv._reset_now": "plays a user env's crash",
    "roll_async/envs/faulty.py::FaultyEnv._maybe_fault": "injects a user env's crash",
    "roll_async/testing/verifiers_envs.py::load_environment": "plays a verifiers env module that cannot load",
    "roll_async/testing/verifiers_envs.py::load_environment.TwoTurnEnv.env_response": "plays a verifiers env's crash mid-episode",
    "roll_async/testing/verifiers_v1_taskset.py::ChatHarness.launch": "plays a verifiers harness's crash mid-episode",
}

#: Exception classes of the library kept outside RollAsyncError: ``file::class`` -> why.
NOT_IN_FAMILY: dict[str, str] = {
    "pipelines/interrupt.py::SignalReceived": "a signal's stop, not a failure: an `except RollAsyncError` must not swallow Ctrl-C",
    "pipelines/interrupt.py::RunInterrupted": "a signal's stop, not a failure: an `except RollAsyncError` must not swallow Ctrl-C",
    "pipelines/interrupt.py::RolloutInterrupted": "a signal's stop, not a failure: an `except RollAsyncError` must not swallow Ctrl-C",
}


@dataclass(frozen=True)
class BareRaise:
    """One ``raise`` of a built-in exception class that no rule allows."""

    where: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: raise {self.name}(...)"


def library_files() -> dict[str, Path]:
    """Every module file of the package, as a repository-relative path (each file once)."""
    modules = source_modules(REPO, mapped_folders(REPO))
    return {
        path.relative_to(REPO).as_posix(): path
        for path in sorted(set(modules.values()))
    }


def _raised_name(node: ast.Raise) -> str | None:
    """The built-in exception class a ``raise`` names (``raise X``, ``raise X(...)``, ``builtins.X``), else None."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        name = exc.id
    elif (
        isinstance(exc, ast.Attribute)
        and isinstance(exc.value, ast.Name)
        and exc.value.id == "builtins"
    ):
        name = exc.attr
    else:
        return (
            None  # a bare re-raise, a variable (`raise exc`), or another module's class
        )
    return name if name in BUILTIN_EXCEPTIONS else None


def _allowed(name: str, function: str, in_method: bool, key: str) -> bool:
    """Whether one of the rules above allows raising the built-in ``name`` in ``function``."""
    own = function.rpartition(".")[2]
    is_dunder = own.startswith("__") and own.endswith("__")
    return (
        name in EXIT_PROTOCOL
        # an abstract or optional method a subclass overrides
        or (name == "NotImplementedError" and in_method)
        or (
            name in PROTOCOL_EXCEPTIONS
            and is_dunder
            and own not in NOT_PROTOCOL_DUNDERS
        )
        or f"{key}::{function}" in SIMULATED_FOREIGN_FAILURES
    )


def bare_raises(key: str, source: str) -> Iterator[BareRaise]:
    """The raises of built-in exception classes in ``source`` (file ``key``) that no rule allows."""

    def walk(node: ast.AST, scope: list[str], in_method: bool) -> Iterator[BareRaise]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Raise) and child.exc is not None:
                name = _raised_name(child)
                if name and not _allowed(name, ".".join(scope), in_method, key):
                    yield BareRaise(key, child.lineno, name)
            if isinstance(child, ast.ClassDef):
                yield from walk(child, [*scope, child.name], False)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(
                    child, [*scope, child.name], isinstance(node, ast.ClassDef)
                )
            else:
                yield from walk(child, scope, in_method)

    yield from walk(ast.parse(source, filename=key), [], False)


def exception_classes(files: dict[str, str]) -> dict[str, list[str]]:
    """``file::class`` -> the last names of its bases, for every class of ``files`` (key -> source)."""
    found: dict[str, list[str]] = {}
    for key, source in files.items():
        for node in ast.walk(ast.parse(source, filename=key)):
            if isinstance(node, ast.ClassDef):
                found[f"{key}::{node.name}"] = [
                    ast.unparse(base).rpartition(".")[2] for base in node.bases
                ]
    return found


def classes_outside_family(files: dict[str, str]) -> list[str]:
    """The exception classes of ``files`` that do not derive from RollAsyncError and are not allowed."""
    classes = exception_classes(files)
    family, grown = {"RollAsyncError"}, True
    while grown:  # a class derives from the family when a base does, transitively
        before = len(family)
        family |= {
            key.rpartition("::")[2]
            for key, bases in classes.items()
            if family.intersection(bases)
        }
        grown = len(family) > before
    names = {key.rpartition("::")[2] for key in classes}
    exceptions, grown = set(BUILTIN_EXCEPTIONS), True
    while grown:  # an exception class: a base is a built-in exception, ends in Error/Exception, or is one
        before = len(exceptions)
        exceptions |= {
            key.rpartition("::")[2]
            for key, bases in classes.items()
            if any(
                base in exceptions or base.endswith(("Error", "Exception"))
                for base in bases
            )
        }
        grown = len(exceptions) > before
    return sorted(
        key
        for key in classes
        if key.rpartition("::")[2] in exceptions & names
        and key.rpartition("::")[2] not in family
        and key != "roll_async/errors.py::RollAsyncError"
        and key not in NOT_IN_FAMILY
    )


@pytest.fixture(scope="module")
def library() -> dict[str, str]:
    return {key: path.read_text() for key, path in library_files().items()}


def test_the_walk_sees_each_library_folder_once():
    keys = list(library_files())
    assert len(keys) == len(set(keys))
    assert {key.partition("/")[0] for key in keys} == {
        "roll_async",
        *mapped_folders(REPO).values(),
    }
    assert not any(
        key.startswith(("roll_async/pipelines/", "roll_async/env_managers/"))
        for key in keys
    )


def test_the_library_raises_no_bare_builtin_exception(library):
    found = [
        str(hit) for key, source in library.items() for hit in bare_raises(key, source)
    ]
    assert not found, (
        "raise a subclass of RollAsyncError (roll_async/errors.py; keep the built-in as a second base where "
        "callers catch it, e.g. InvalidInputError for a ValueError), or extend a rule in this test with its "
        "reason:\n" + "\n".join(found)
    )


def test_every_library_exception_class_derives_from_roll_async_error(library):
    outside = classes_outside_family(library)
    assert not outside, (
        "derive these from RollAsyncError (keep the built-in as a second base), or list them in "
        "NOT_IN_FAMILY with the reason:\n" + "\n".join(outside)
    )


def test_the_allowed_entries_still_exist(library):
    classes = exception_classes(library)
    assert set(NOT_IN_FAMILY) <= set(classes), (
        "NOT_IN_FAMILY names a class that is gone"
    )
    for entry in SIMULATED_FOREIGN_FAILURES:
        key, _, function = entry.partition("::")
        assert function.rpartition(".")[2] in library[key], f"{entry} is gone"


RULES_SAMPLE = """
class Base:
    def step(self):
        raise NotImplementedError
    def __getattr__(self, name):
        raise AttributeError(name)
    def __init__(self):
        raise TypeError("flagged: a constructor is no protocol")
def main():
    raise SystemExit("bye")
def helper():
    raise ValueError("flagged")
def reraise(exc):
    try:
        pass
    except OSError:
        raise
    raise exc
def timeout():
    raise TimeoutError
def foreign():
    raise asyncio.CancelledError()
def builtin_module():
    raise builtins.RuntimeError("flagged")
def not_a_method():
    raise NotImplementedError("flagged: no class overrides it")
"""


def test_the_rules_flag_exactly_the_bare_builtins():
    found = [(hit.line, hit.name) for hit in bare_raises("sample.py", RULES_SAMPLE)]
    assert found == [
        (8, "TypeError"),
        (12, "ValueError"),
        (20, "TimeoutError"),
        (24, "RuntimeError"),
        (26, "NotImplementedError"),
    ]
    sample_classes = {
        "a.py": "class A(ValueError): ...\nclass B(A): ...\nclass C(RollAsyncError, ValueError): ...\n"
        "class D(C): ...\nclass E(Generic[T]): ...\nclass F(lib.SomeException): ...\n",
    }
    assert classes_outside_family(sample_classes) == ["a.py::A", "a.py::B", "a.py::F"]
