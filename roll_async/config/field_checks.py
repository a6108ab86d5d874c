"""The one pass over a config's fields: the words a ``Literal`` key accepts and the limits of a number.

A key's limits are declared beside it (``bounded(1, ge=1)`` in roll_async/config/sections.py puts them in
the field's metadata), so this pass, the reference page and the rule itself cannot drift apart. Every
problem found is reported at once, one line each naming the key, its value and the fix, like torchtune's
``ConfigError``. Rules that span fields or sections stay in roll_async/config/validation.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal

from roll_async.errors import ConfigError

#: Field-metadata keys of a limit and how each reads in a message and on the reference page.
LIMIT_WORDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    note: str = "",
) -> Any:
    """A dataclass field (``default``: none given, a required field) whose value must meet the given limits.

    ``note`` follows the limit in the message (what a bound value means, or the unit).
    """
    limits = {
        name: bound
        for name, bound in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt))
        if bound is not None
    }
    return field(default=default, metadata={**limits, "note": note})


def limit_text(metadata: Mapping[str, Any]) -> str:
    """``>= 1``, ``>= 0 and <= 1``: a field's limits as a message and the reference page write them."""
    return " and ".join(
        f"{word} {metadata[name]}"
        for name, word in LIMIT_WORDS.items()
        if name in metadata
    )


def limit_problem(key: str, value: Any, metadata: Mapping[str, Any]) -> str | None:
    """``key=value: must be >= 1`` when a number breaks its field's limits, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # not a number (None, an interpolation): the type check and the loader report it
    broken = (
        ("gt" in metadata and not value > metadata["gt"])
        or ("ge" in metadata and not value >= metadata["ge"])
        or ("lt" in metadata and not value < metadata["lt"])
        or ("le" in metadata and not value <= metadata["le"])
        or math.isnan(value)
    )
    if not broken:
        return None
    note = metadata.get("note", "")
    return f"{key}={value}: must be {limit_text(metadata)}{' ' + note if note else ''}"


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def _spoken_list(words: typing.Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@functools.cache
def _resolved_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_ABSENT = object()


def _value_of(values: Any, name: str) -> Any:
    if dataclasses.is_dataclass(values):
        return getattr(values, name, _ABSENT)
    if isinstance(values, Mapping):
        return values.get(name, _ABSENT)
    return _ABSENT  # a wrong type for a section: the loader reports it


def _optional_section(hint: Any) -> type | None:
    """The dataclass of a ``Section | None`` key (custom_envs.<Tag>.reward), else None."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    section = args[0] if len(args) == 1 else None
    return (
        section
        if isinstance(section, type) and dataclasses.is_dataclass(section)
        else None
    )


def field_problems(cls: type, values: Any, prefix: str = "") -> list[str]:
    """One line per key of dataclass ``cls`` in ``values`` that is not one of its words or breaks its limits.

    ``values`` is an instance of ``cls`` or a mapping of raw keys (a YAML file or the overrides, before
    OmegaConf sees them); nested sections, ``custom_envs.<Tag>`` entries and a set optional section are
    checked too. Interpolations (``${...}``) are left to the check of the loaded config.
    """
    hints = _resolved_hints(cls)
    problems: list[str] = []
    for f in dataclasses.fields(cls):
        value = _value_of(values, f.name)
        if value is _ABSENT:
            continue
        hint, key = hints[f.name], prefix + f.name
        section = (
            hint
            if isinstance(hint, type) and dataclasses.is_dataclass(hint)
            else _optional_section(hint)
        )
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            interpolation = isinstance(value, str) and value.startswith("${")
            if value not in choices and not interpolation:
                problems.append(
                    f"{key}={value!r} is unknown; use {_spoken_list(choices)}."
                    f"{did_you_mean(str(value), choices)}"
                )
        elif section is not None:
            if value is not None:
                problems.extend(field_problems(section, value, key + "."))
        elif typing.get_origin(hint) is dict and isinstance(value, Mapping):
            entry_type = typing.get_args(hint)[1]
            if isinstance(entry_type, type) and dataclasses.is_dataclass(entry_type):
                for name, entry in value.items():
                    problems.extend(field_problems(entry_type, entry, f"{key}.{name}."))
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(
                value
            )  # a raw YAML/override int, as the loaded config will hold it
        problem = limit_problem(key, value, f.metadata)
        if problem:
            problems.append(problem)
    return problems


def check_fields(cls: type, values: Any, prefix: str = "") -> None:
    """Raise one ConfigError listing every problem :func:`field_problems` finds (one line each)."""
    problems = field_problems(cls, values, prefix)
    if problems:
        raise ConfigError("\n".join(problems))


def from_mapping(cls: type, values: Any, what: str, who: str) -> Any:
    """``cls`` (a dataclass) from None, an instance or a mapping, naming a key it does not accept.

    ``what`` names the mapping (``env_config``, ``docker runtime config``), ``who`` what reads it. A
    class's ``replaced_keys`` (old key -> what to set instead) turn an old config into that advice; any
    other unknown key fails naming the accepted ones, so a typo is never silently a default.
    """
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        values = dataclasses.asdict(values)
    if not isinstance(values, Mapping) and not hasattr(values, "keys"):
        raise ConfigError(
            f"{what} for {who} must be a mapping, got {type(values).__name__}"
        )
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in values if k not in accepted]
    replaced: dict[str, str] = getattr(cls, "replaced_keys", {})
    for key in unknown:
        if key in replaced:
            raise ConfigError(
                f"{what} key {key!r} is no longer accepted by {who}; set {replaced[key]}"
            )
    if unknown:
        raise ConfigError(
            f"{what} key {unknown[0]!r} is not accepted by {who}; accepted keys: {', '.join(accepted)}"
        )
    return cls(**dict(values))
