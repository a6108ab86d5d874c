"""docs/api-reference.md is generated from the public names' docstrings: it must match."""

from __future__ import annotations

import roll_async
from roll_async.api_reference import PAGE, REGENERATE_COMMAND, parse_docstring, render


def test_the_checked_in_api_reference_page_is_the_generated_one():
    assert PAGE.is_file(), f"{PAGE} is missing; write it with `{REGENERATE_COMMAND}`"
    assert PAGE.read_text() == render(), (
        f"{PAGE} differs from the docstrings of roll_async.__all__; regenerate it with "
        f"`{REGENERATE_COMMAND}` and commit the result"
    )


def test_google_sections_are_split_into_entries():
    doc = parse_docstring(
        "Summary.\n\nMore.\n\nArgs:\n    a: First,\n        continued.\n    b: Second.\n\n"
        "Returns:\n    The\n    result.\n\nRaises:\n    ValueError: When bad."
    )
    assert doc.text == "Summary.\n\nMore."
    assert doc.sections == {
        "Args": [("a", "First, continued."), ("b", "Second.")],
        "Returns": [("", "The result.")],
        "Raises": [("ValueError", "When bad.")],
    }


def test_every_public_name_has_a_section_on_the_page():
    page = render()
    for name in roll_async.__all__:
        assert f"\n### `{name}`\n" in page, name
