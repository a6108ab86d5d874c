"""Renders docs/api-reference.md from the public names' docstrings, so the page shows the API as it is.

The public names are ``roll_async.__all__``; each gets its signature, its docstring with the
Google-style sections (``Args:``, ``Returns:``, ``Raises:``, ``Attributes:``) as lists, the fields
of a dataclass (type, default, and the ``#:`` comment above the field) and its public methods.
A unit test fails when the checked-in page differs from what this renders. Regenerate with
``python -m roll_async.api_reference --write``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import roll_async
from roll_async.config.reference import cell, field_comments, page_main

REGENERATE_COMMAND = "python -m roll_async.api_reference --write"
#: The page's place in a source checkout.
PAGE = Path(__file__).resolve().parents[1] / "docs" / "api-reference.md"
#: Google-style section headers, in the order the page shows them.
SECTIONS = ("Args", "Returns", "Yields", "Raises", "Attributes")
#: Sections whose lines are ``name: meaning`` entries (the others are prose).
_ENTRY_SECTIONS = frozenset({"Args", "Raises", "Attributes"})
#: Dataclasses whose fields another generated page lists.
_FIELDS_ELSEWHERE = {
    "PipelineConfig": "every key, per section: [config-reference.md](config-reference.md)"
}


@dataclass
class Docstring:
    """A docstring split into its prose and its Google-style sections."""

    #: Everything before the first section header.
    text: str
    #: Section name -> ``(name, meaning)`` entries (name is "" in a prose section such as Returns).
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def parse_docstring(doc: str | None) -> Docstring:
    """Split a (cleaned) docstring at its ``Args:``/``Returns:``/... headers.

    Args:
        doc: The docstring, as ``inspect.getdoc`` returns it (dedented), or None.

    Returns:
        The prose before the first header, and each section's entries: ``name: meaning`` lines
        with their indented continuation lines joined for ``Args``, ``Raises`` and
        ``Attributes``, one prose entry for the others.
    """
    lines = (doc or "").splitlines()
    header = re.compile(rf"^({'|'.join(SECTIONS)}):\s*$")
    starts = [i for i, line in enumerate(lines) if header.match(line)]
    text = "\n".join(lines[: starts[0]] if starts else lines).strip()
    sections: dict[str, list[tuple[str, str]]] = {}
    for n, start in enumerate(starts):
        name = lines[start].strip()[:-1]
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        body = textwrap.dedent("\n".join(lines[start + 1 : end])).strip("\n")
        if name not in _ENTRY_SECTIONS:
            sections[name] = [("", " ".join(body.split()))]
            continue
        entries: list[tuple[str, str]] = []
        for line in body.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, meaning = line.partition(":")
                entries.append((key.strip(), meaning.strip()))
            elif entries and line.strip():
                key, meaning = entries[-1]
                entries[-1] = (key, f"{meaning} {line.strip()}".strip())
        sections[name] = entries
    return Docstring(text, sections)


def class_field_comments(cls: type) -> dict[str, str]:
    """Field name -> the ``#:`` comment lines right above it, joined into one line (commented fields only)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    return {name: text for (_, name), text in field_comments(source).items() if text}


def markdown(text: str) -> str:
    """reST inline markup as markdown: ``x`` and :class:`~pkg.x` become `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


class _Shown(str):
    """An annotation string that a signature prints as written, not quoted."""

    def __repr__(self) -> str:
        return str(self)


def signature(obj: Any) -> str:
    """``(a: int, b: str | None = None) -> bool`` with the annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def shown(annotation: Any) -> Any:
        return _Shown(annotation) if isinstance(annotation, str) else annotation

    params = [
        p.replace(annotation=shown(p.annotation)) for p in sig.parameters.values()
    ]
    # a class's signature is its constructor's: no return annotation
    returns = inspect.Signature.empty if inspect.isclass(obj) else sig.return_annotation
    return str(sig.replace(parameters=params, return_annotation=shown(returns)))


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "(required)"


def _fields_table(cls: type, doc: Docstring) -> list[str]:
    comments = class_field_comments(cls)
    documented = dict(doc.sections.get("Attributes", []))
    rows = ["| Field | Type | Default | Meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        hint = f.type if isinstance(f.type, str) else inspect.formatannotation(f.type)
        meaning = comments.get(f.name) or documented.get(f.name, "")
        rows.append(
            f"| `{f.name}` | `{cell(hint)}` | {cell(_default(f))} | {cell(markdown(meaning))} |"
        )
    return rows


def _doc_lines(doc: Docstring, skip: frozenset[str] = frozenset()) -> list[str]:
    """The prose, then each section as a bold label and a list."""
    lines = [markdown(doc.text), ""] if doc.text else []
    for name in SECTIONS:
        if name not in doc.sections or name in skip:
            continue
        entries = doc.sections[name]
        lines.append(f"**{name}**")
        lines.append("")
        for key, meaning in entries:
            meaning = markdown(meaning)
            lines.append(f"- `{key}`: {meaning}" if key else f"- {meaning}")
        lines.append("")
    return lines


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties the class itself defines, in source order."""
    found: list[tuple[str, Any]] = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property) or inspect.isfunction(member):
            found.append((name, member))
        elif isinstance(member, (staticmethod, classmethod)):
            found.append((name, member.__func__))
    return found


def _member_lines(cls: type, name: str, member: Any) -> list[str]:
    if isinstance(member, property):
        assert member.fget is not None  # a documented property has a getter
        returns = inspect.signature(member.fget).return_annotation
        shown = f"{name}: {returns}" if returns is not inspect.Signature.empty else name
        code = f"@property\n{shown}"
        doc = parse_docstring(inspect.getdoc(member.fget))
    else:
        code = f"{name}{signature(member)}"
        doc = parse_docstring(inspect.getdoc(member))
    lines = [f"#### `{cls.__name__}.{name}`", "", "```python", code, "```", ""]
    return lines + _doc_lines(doc)


def _class_lines(name: str, cls: type) -> list[str]:
    bases = ", ".join(base.__name__ for base in cls.__bases__ if base is not object)
    code = f"class {name}({bases})" if bases else f"class {name}"
    init = vars(cls).get("__init__")
    if not dataclasses.is_dataclass(cls) and inspect.isfunction(init):
        code += f"\n{name}{signature(cls)}"
    doc = parse_docstring(inspect.getdoc(cls))
    lines = ["```python", code, "```", ""]
    if dataclasses.is_dataclass(cls):
        lines += _doc_lines(doc, skip=frozenset({"Attributes"}))
        if name in _FIELDS_ELSEWHERE:
            lines += [f"Fields: {_FIELDS_ELSEWHERE[name]}.", ""]
        else:
            lines += _fields_table(cls, doc) + [""]
    else:
        lines += _doc_lines(doc)
    if not issubclass(cls, BaseException):
        for member_name, member in _members(cls):
            lines += _member_lines(cls, member_name, member)
    return lines


def public_names() -> list[tuple[str, Any]]:
    """``(name, object)`` for each name in ``roll_async.__all__``, in its order."""
    return [(name, getattr(roll_async, name)) for name in roll_async.__all__]


def render() -> str:
    """The whole page, as markdown: one section per defining module, in ``__all__``'s order."""
    by_module: dict[str, list[tuple[str, Any]]] = {}
    for name, obj in public_names():
        by_module.setdefault(obj.__module__, []).append((name, obj))
    lines = [
        "# API reference",
        "",
        "<!-- Generated from the docstrings of roll_async.__all__; do not edit by hand. Regenerate with:",
        f"     {REGENERATE_COMMAND} -->",
        "",
        "The public names: import them from `roll_async` (`from roll_async import register_env`).",
        "`import roll_async` loads only the errors; each other name loads its module on first use.",
        "Config keys are in [config-reference.md](config-reference.md), the design in",
        "[architecture.md](architecture.md).",
    ]
    for module_name, members in by_module.items():
        module_doc = inspect.getdoc(importlib.import_module(module_name)) or ""
        lines += ["", f"## `{module_name}`", ""]
        if module_doc:
            lines += [markdown(module_doc.split("\n\n")[0].replace("\n", " ")), ""]
        for name, obj in members:
            lines += [f"### `{name}`", ""]
            if isinstance(obj, type):
                lines += _class_lines(name, obj)
            else:
                lines += ["```python", f"def {name}{signature(obj)}", "```", ""]
                lines += _doc_lines(parse_docstring(inspect.getdoc(obj)))
    while lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(
        argv, prog="python -m roll_async.api_reference", page=PAGE, render=render
    )


if __name__ == "__main__":
    sys.exit(main())
