"""Pull the action out of a model response: one parser shared by every env.

The action sits inside ``<answer>...</answer>`` by default (any regex with one
capture group works; the last match wins, so a model may mention the tag while
thinking). Grid envs accept several actions in one turn, split by a separator
and capped at ``max_actions``; extra actions are dropped and counted rather than
penalised, as RAGEN does. A missing tag, an empty answer or an unknown action
word makes the turn invalid: the caller applies its format penalty, and the
valid actions before the first bad one still run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from roll_async.errors import ConfigError


@dataclass
class ParsedAction:
    """The outcome of parsing one response."""

    #: Canonical actions to run, in order (the valid prefix, capped at max_actions).
    actions: list[str] = field(default_factory=list)
    #: Text inside the tags, or None when no tag was found.
    raw: str | None = None
    #: True when a tag was found and every action in it (up to the cap) is valid.
    is_valid: bool = False
    #: Why the turn is invalid (None when valid).
    error: str | None = None
    #: Actions beyond max_actions that were ignored.
    num_dropped: int = 0


class ActionParser:
    """Parse responses with a fixed pattern, separator, action cap and optional action vocabulary."""

    def __init__(
        self,
        pattern: str = r"<answer>(.*?)</answer>",
        separator: str = ",",
        max_actions: int = 1,
        valid_actions: Iterable[str] | None = None,
    ) -> None:
        try:
            self.regex = re.compile(pattern, re.DOTALL)
        except re.error as e:
            raise ConfigError(
                f"action_pattern {pattern!r} is not a valid regex: {e}"
            ) from e
        if self.regex.groups < 1:
            raise ConfigError(
                f"action_pattern {pattern!r} needs one capture group around the action"
            )
        if max_actions < 1:
            raise ConfigError(f"max_actions must be >= 1, got {max_actions}")
        self.pattern = pattern
        self.separator = separator
        self.max_actions = max_actions
        #: lower-case word -> canonical word; None means free-form (any non-empty text).
        self.vocab = {w.lower(): w for w in valid_actions} if valid_actions else None

    def parse(self, text: str) -> ParsedAction:
        matches = self.regex.findall(text or "")
        if not matches:
            return ParsedAction(
                error=f"no action found; expected the pattern {self.wrap('...')}"
            )
        raw = matches[-1]
        raw = raw[0] if isinstance(raw, tuple) else raw
        content = raw.strip()
        if not content:
            return ParsedAction(raw=raw, error="empty action")
        parts = (
            [p.strip() for p in content.split(self.separator)]
            if self.separator
            else [content]
        )
        parts = [p for p in parts if p]
        dropped = max(0, len(parts) - self.max_actions)
        parts = parts[: self.max_actions]
        if self.vocab is None:
            return ParsedAction(
                actions=parts, raw=raw, is_valid=True, num_dropped=dropped
            )
        actions: list[str] = []
        for p in parts:
            word = self.vocab.get(p.lower())
            if word is None:
                return ParsedAction(
                    actions=actions,
                    raw=raw,
                    error=f"unknown action {p!r}",
                    num_dropped=dropped,
                )
            actions.append(word)
        return ParsedAction(
            actions=actions, raw=raw, is_valid=True, num_dropped=dropped
        )

    def wrap(self, action: str) -> str:
        """Render ``action`` the way the pattern expects it (for instructions and expert demos)."""
        return wrap_with_pattern(self.pattern, action)


def wrap_with_pattern(pattern: str, action: str) -> str:
    """Replace the first capture group of a literal-ish pattern with ``action`` and unescape the rest."""
    start = pattern.find("(")
    while start > 0 and pattern[start - 1] == "\\":
        start = pattern.find("(", start + 1)
    if start < 0:
        return action
    depth, end = 0, start
    for end in range(start, len(pattern)):
        if pattern[end] == "\\":
            continue
        if pattern[end] == "(" and (end == 0 or pattern[end - 1] != "\\"):
            depth += 1
        elif pattern[end] == ")" and pattern[end - 1] != "\\":
            depth -= 1
            if depth == 0:
                break
    head, tail = pattern[:start], pattern[end + 1 :]
    return f"{_unescape(head)}{action}{_unescape(tail)}"


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s.lstrip("^").rstrip("$"))
