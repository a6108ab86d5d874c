"""docs/config-reference.md is generated from the schema: it must match, and every key must have a meaning."""

from __future__ import annotations

import dataclasses

from roll_async.config import sections
from roll_async.config.reference import (
    PAGE,
    REGENERATE_COMMAND,
    field_comments,
    render,
)


def test_the_checked_in_reference_page_is_the_generated_one():
    assert PAGE.is_file(), f"{PAGE} is missing; write it with `{REGENERATE_COMMAND}`"
    assert PAGE.read_text() == render(), (
        f"{PAGE} differs from the schema (roll_async/config/sections.py); regenerate it with "
        f"`{REGENERATE_COMMAND}` and commit the result"
    )


def test_every_key_has_a_one_line_meaning():
    comments = field_comments()
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in vars(sections).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls)
        for f in dataclasses.fields(cls)
        if not comments.get((cls.__name__, f.name))
    ]
    assert not missing, (
        f"add a `#:` comment above each of these fields in roll_async/config/sections.py: {missing}"
    )
