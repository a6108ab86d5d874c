"""Renders docs/config-reference.md from the schema, so the page lists exactly the keys a config can set.

Each key's type, limits and default come from the dataclasses in roll_async/config/sections.py and its meaning
from the ``#:`` comment above the field; a unit test fails when the checked-in page differs from what
this renders. Regenerate with ``python -m roll_async.config.reference --write``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from roll_async.config import sections
from roll_async.config.field_checks import limit_text
from roll_async.config.sections import MISSING, PipelineConfig

REGENERATE_COMMAND = "python -m roll_async.config.reference --write"
#: The page's place in a source checkout.
PAGE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"
#: Fields written under another name in YAML (``from`` is a Python keyword; see loading._replay_from_alias).
_YAML_NAMES = {("ReplayConfig", "from_dir"): "from"}


def field_comments(source: str | None = None) -> dict[tuple[str, str], str]:
    """(class name, field name) -> its ``#:`` comment lines joined into one line ("" where none).

    ``source``: the Python source whose top-level classes are read; default the config sections.
    """
    source = inspect.getsource(sections) if source is None else source
    lines = source.splitlines()
    comments: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.AnnAssign) or not isinstance(
                statement.target, ast.Name
            ):
                continue
            above: list[str] = []
            row = statement.lineno - 2  # 0-based index of the line above the field
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            comments[(node.name, statement.target.id)] = " ".join(above)
    return comments


def type_name(hint: Any) -> str:
    """How a key's type reads in the page: ``int``, ``str | None``, ``list[str]``, ``sync | async``."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(str(choice) for choice in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(hint))
    if origin is not None:
        args = ", ".join(type_name(arg) for arg in typing.get_args(hint))
        return f"{origin.__name__}[{args}]"
    if hint is type(None):
        return "None"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def yaml_value(value: Any) -> str:
    """A default as it would be written in YAML (``null``, ``true``, ``[0.9, 0.999]``)."""
    if value is MISSING:
        return "(required)"
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def cell(text: str) -> str:
    """Table-cell safe: ``|`` would end the cell and ``<Tag>`` would read as an HTML tag."""
    return text.replace("|", "\\|").replace("<", "\\<").replace("\n", " ")


def optional_section(hint: Any) -> type | None:
    """The dataclass of a ``Section | None`` key (a section that is off unless set), else None."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if (
        len(args) == 1
        and isinstance(args[0], type)
        and dataclasses.is_dataclass(args[0])
    ):
        return args[0]
    return None


def _section_table(
    cls: type, instance: Any, comments: dict[tuple[str, str], str]
) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = ["| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        name = _YAML_NAMES.get((cls.__name__, f.name), f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            kind, default = "section", ""
        elif typing.get_origin(hint) is dict and dataclasses.is_dataclass(
            typing.get_args(hint)[1]
        ):
            kind, default = "sections by tag", "`{}`"
        elif optional_section(hint) is not None:
            kind, default = "section or null", "`null`"
        else:
            limits = limit_text(f.metadata)
            kind = cell(type_name(hint) + (f" ({limits})" if limits else ""))
            default = f"`{cell(yaml_value(getattr(instance, f.name)))}`"
        meaning = comments.get((cls.__name__, f.name), "")
        rows.append(f"| `{name}` | {kind} | {default} | {cell(meaning)} |")
    return rows


def _sections() -> list[tuple[str, type, Any, str]]:
    """(heading, dataclass, instance with the defaults, note) per section, in PipelineConfig's order."""
    top = PipelineConfig()
    hints = typing.get_type_hints(PipelineConfig)
    found: list[tuple[str, type, Any, str]] = [("Top level", PipelineConfig, top, "")]
    seen: dict[type, int] = {}
    for f in dataclasses.fields(PipelineConfig):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if hint in seen:  # val_env_manager: same keys as train_env_manager
                index = seen[hint]
                heading, cls, instance, note = found[index]
                differing = [
                    f"{g.name}={yaml_value(getattr(getattr(top, f.name), g.name))}"
                    for g in dataclasses.fields(hint)
                    if getattr(getattr(top, f.name), g.name)
                    != getattr(instance, g.name)
                ]
                note = f"`{f.name}` has the same keys; its defaults differ in: {', '.join(differing)}."
                found[index] = (f"{heading}, `{f.name}`", cls, instance, note)
                continue
            seen[hint] = len(found)
            found.append((f"`{f.name}`", hint, getattr(top, f.name), ""))
            section_hints = typing.get_type_hints(hint)
            # a section inside a section (trainer.lora)
            for g in dataclasses.fields(hint):
                sub = section_hints[g.name]
                if isinstance(sub, type) and dataclasses.is_dataclass(sub):
                    found.append(
                        (
                            f"`{f.name}.{g.name}`",
                            sub,
                            getattr(getattr(top, f.name), g.name),
                            "",
                        )
                    )
        elif typing.get_origin(hint) is dict:
            entry = typing.get_args(hint)[1]
            if isinstance(entry, type) and dataclasses.is_dataclass(entry):
                note = "One entry per env tag; the tag is the key under `custom_envs`."
                found.append((f"`{f.name}.<Tag>`", entry, entry(), note))
                entry_hints = typing.get_type_hints(entry)
                for g in dataclasses.fields(entry):
                    sub = optional_section(entry_hints[g.name])
                    if sub is not None:
                        note = "Off (`null`) unless set; setting any key turns it on with these defaults."
                        found.append((f"`{f.name}.<Tag>.{g.name}`", sub, sub(), note))
                    elif dataclasses.is_dataclass(
                        entry_hints[g.name]
                    ):  # custom_envs.<Tag>.pool
                        sub = entry_hints[g.name]
                        found.append((f"`{f.name}.<Tag>.{g.name}`", sub, sub(), ""))
    return found


def render() -> str:
    """The whole page, as markdown."""
    comments = field_comments()
    lines = [
        "# Config reference",
        "",
        "<!-- Generated from roll_async/config/sections.py; do not edit by hand. Regenerate with:",
        f"     {REGENERATE_COMMAND} -->",
        "",
        "Every key a config file or a `key=value` override can set, per section, with its type, default and",
        "meaning. A key whose type lists words (`sync | async`) accepts exactly those; a limit after the type",
        "(`int (>= 1)`) is checked at load, with every other single-key problem, in one error. Config files",
        "include others with `defaults: [base]`; `roll-async train CONFIG --check` loads and checks one",
        "without starting anything.",
    ]
    for heading, cls, instance, note in _sections():
        lines += ["", f"## {heading}", ""]
        doc = inspect.getdoc(cls) or ""
        intro = doc.split("\n\n")[0].replace("\n", " ")
        if intro and not intro.startswith(cls.__name__ + "("):
            lines += [intro, ""]
        if note:
            lines += [note, ""]
        lines += _section_table(cls, instance, comments)
    return "\n".join(lines) + "\n"


def page_main(
    argv: list[str] | None, *, prog: str, page: Path, render: Callable[[], str]
) -> int:
    """The command line of a generated docs page: print it, or write it to ``page`` with ``--write``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"Print the generated page (markdown), or write it to {page.relative_to(page.parents[1])}.",
    )
    parser.add_argument(
        "--write", action="store_true", help=f"write {page} instead of printing"
    )
    args = parser.parse_args(argv)
    if args.write:
        page.write_text(render())
        print(page)
    else:
        sys.stdout.write(render())
    return 0


def main(argv: list[str] | None = None) -> int:
    return page_main(
        argv, prog="python -m roll_async.config.reference", page=PAGE, render=render
    )


if __name__ == "__main__":
    sys.exit(main())
