"""Countdown: combine the given numbers with + - * / and parentheses to hit the target.

A small arithmetic task with a checkable answer and always a solution, for
math-style RL without a dataset.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig, InvalidAction
from roll_async.errors import ConfigError, ParseError, TaskGenerationError


@dataclass
class CountdownConfig(EnvConfig):
    max_steps: int = 3
    num_numbers: int = 4
    max_number: int = 25
    #: Targets are drawn in [1, max_target].
    max_target: int = 100
    success_reward: float = 1.0
    wrong_answer_reward: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.num_numbers, self.max_number, self.max_target = (
            int(self.num_numbers),
            int(self.max_number),
            int(self.max_target),
        )
        if not 2 <= self.num_numbers <= 6:
            raise ConfigError(f"num_numbers must be in [2, 6], got {self.num_numbers}")
        if self.max_number < 2:
            raise ConfigError(f"max_number must be >= 2, got {self.max_number}")
        if self.max_target < 2:
            raise ConfigError(f"max_target must be >= 2, got {self.max_target}")


class CountdownEnv(BaseEnv):
    """Arithmetic puzzle; one free-form expression per turn.

    A task draws ``num_numbers`` integers in [1, ``max_number``] and builds the
    target by combining all of them at random (positive, exact results only), so a
    solution always exists; any solution may use each number at most once. The
    answer is checked by a small recursive-descent parser over exact fractions,
    never ``eval``; ``x``/``×`` and ``÷`` are read as ``*`` and ``/``, and a
    trailing ``= <number>`` is ignored.

    Text render::

        Numbers: 3 7 25 50
        Target: 75
    """

    config_cls: ClassVar[type] = CountdownConfig
    multi_action: ClassVar[bool] = False

    def __init__(
        self, config: CountdownConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: CountdownConfig
        self.numbers: list[int] = []
        self.target = 0
        self.last_value: Fraction | None = None

    def _reset(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        cfg = self.config
        for _ in range(1000):
            numbers = [
                int(x)
                for x in rng.integers(1, cfg.max_number + 1, size=cfg.num_numbers)
            ]
            target = _random_combination(rng, numbers)
            if (
                target is not None
                and 1 <= target <= cfg.max_target
                and target not in numbers
            ):
                self.numbers, self.target = numbers, target
                self.last_value = None
                return
        raise TaskGenerationError(
            f"could not draw a countdown task with {cfg}; raise max_target or max_number"
        )

    def _apply(self, action: str) -> tuple[float, bool, str]:
        cfg = self.config
        try:
            value, used = parse_expression(action)
        except ValueError as e:
            raise InvalidAction(f"invalid expression: {e}") from None
        extra = Counter(used) - Counter(self.numbers)
        if extra:
            raise InvalidAction(
                f"uses numbers not available: {sorted(extra.elements())}"
            )
        self.last_value = value
        if value == self.target:
            self.success = True
            self.done = True
            return cfg.success_reward, True, f"Correct: {_fmt(value)} = {self.target}."
        return (
            cfg.wrong_answer_reward,
            False,
            f"Your expression equals {_fmt(value)}, not {self.target}.",
        )

    def render_text(self) -> str:
        return f"Numbers: {' '.join(map(str, self.numbers))}\nTarget: {self.target}"

    def instruction(self) -> str:
        return (
            "You are playing Countdown. Write an arithmetic expression that equals the target, using the given "
            "numbers with + - * / and parentheses. Each number may be used at most once; not all need to be used.\n"
            f"Rewards: +{self.config.success_reward:g} for a correct expression, {self.config.wrong_answer_reward:g} "
            "for a wrong one.\n" + self.answer_format("(3 + 5) * 2")
        )

    def solve(self) -> list[str] | None:
        """One expression reaching the target (exhaustive search over pairings, memoised on the values left)."""
        expr = solve_countdown(self.numbers, self.target)
        return None if expr is None else [expr]


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def _random_combination(rng: np.random.Generator, numbers: list[int]) -> int | None:
    """Fold all numbers together in random order with random ops whose results stay positive integers."""
    pool = list(numbers)
    while len(pool) > 1:
        i, j = (int(k) for k in rng.choice(len(pool), 2, replace=False))
        a, b = pool[i], pool[j]
        options = [a + b, a * b]
        if a > b:
            options.append(a - b)
        if b > 1 and a % b == 0:
            options.append(a // b)
        value = options[int(rng.integers(len(options)))]
        pool = [x for k, x in enumerate(pool) if k not in (i, j)] + [value]
    return pool[0]


_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Value and the integer literals of an expression of +, -, *, /, parentheses and non-negative integers.

    Raises ParseError on anything else (unknown characters, unbalanced parentheses, division by zero).
    """
    text = text.replace("×", "*").replace("x", "*").replace("X", "*").replace("÷", "/")
    text = re.sub(r"=\s*-?\d+(\.\d+)?\s*$", "", text.strip())
    tokens: list[str] = []
    for num, sym in _TOKEN.findall(text):
        if num:
            if len(num) > 6:
                raise ParseError(f"number {num} is too long")
            tokens.append(num)
        elif sym in "+-*/()":
            tokens.append(sym)
        elif sym.strip():
            raise ParseError(f"unexpected character {sym!r}")
    if not tokens:
        raise ParseError("empty expression")
    pos = 0
    used: list[int] = []

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def expr() -> Fraction:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    def term() -> Fraction:
        value = factor()
        while peek() in ("*", "/"):
            op = take()
            rhs = factor()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ParseError("division by zero")
            else:
                value /= rhs
        return value

    def factor() -> Fraction:
        tok = peek()
        if tok is None:
            raise ParseError("expression ends early")
        if tok == "(":
            take()
            value = expr()
            if peek() != ")":
                raise ParseError("missing ')'")
            take()
            return value
        if tok.isdigit():
            take()
            used.append(int(tok))
            return Fraction(int(tok))
        raise ParseError(f"unexpected {tok!r}")

    value = expr()
    if pos != len(tokens):
        raise ParseError(f"unexpected {tokens[pos]!r}")
    return value, used


def solve_countdown(numbers: list[int], target: int) -> str | None:
    """Combine pairs recursively over exact fractions; returns an expression string or None."""
    seen: set[tuple[Fraction, ...]] = set()
    goal = Fraction(target)

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        for v, e in items:
            if v == goal:
                return e
        key = tuple(sorted(v for v, _ in items))
        if len(items) < 2 or key in seen:
            return None
        seen.add(key)
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                cands = []
                if i < j:
                    cands += [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
                cands.append((a - b, f"({ea} - {eb})"))
                if b != 0:
                    cands.append((a / b, f"({ea} / {eb})"))
                for v, e in cands:
                    found = search(rest + [(v, e)])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    # A combined expression always carries the parentheses of its last operation; drop them.
    if found is not None and found.startswith("(") and found.endswith(")"):
        found = found[1:-1]
    return found
