"""Generate the shipped math problems: arithmetic and algebra word problems with exact answers, made by seed.

The math env needs a default dataset that works offline, so the project makes
its own: each template draws numbers and computes the answer exactly (integers,
fractions via :class:`fractions.Fraction`, polynomials, surds) and writes it in
the LaTeX a model would (``\\frac{9}{2}``, ``x^2 + x - 6``, ``6\\sqrt{2}``). The same
seed gives the same file; regenerate the shipped one with
``python -m roll_async.envs.math_data --out roll_async/envs/data/math_tasks.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from roll_async.errors import InvalidInputError, TaskGenerationError

SHIPPED_TASKS = Path(__file__).parent / "data" / "math_tasks.jsonl"
SHIPPED_NUM = 320
SHIPPED_SEED = 0
#: Every ``VAL_EVERY``-th problem is in the ``val`` split, the rest in ``train``.
VAL_EVERY = 5

Problem = tuple[str, str]  # (problem text, answer in LaTeX)


def latex_number(value: Fraction | int) -> str:
    """``7``, ``-7``, ``\\frac{9}{2}``, ``-\\frac{3}{4}``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def latex_polynomial(coefficients: list[int], var: str = "x") -> str:
    """Coefficients from the highest power down, e.g. ``[1, 1, -6]`` -> ``x^2 + x - 6``."""
    terms: list[str] = []
    degree = len(coefficients) - 1
    for k, c in enumerate(coefficients):
        power = degree - k
        if c == 0:
            continue
        mag = abs(c)
        body = var if power == 1 else f"{var}^{power}" if power > 1 else ""
        text = (str(mag) if mag != 1 or not body else "") + body
        if not terms:
            terms.append(("-" if c < 0 else "") + text)
        else:
            terms.append(("- " if c < 0 else "+ ") + text)
    return " ".join(terms) or "0"


def _shop(rng: random.Random) -> Problem:
    name = rng.choice(["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"])
    item = rng.choice(["notebooks", "pens", "apples", "tickets", "mugs"])
    count, price = rng.randint(2, 9), rng.randint(2, 15)
    bill = ((count * price) // 10 + 1) * 10 + rng.choice([0, 10, 20])
    return (
        f"{name} buys {count} {item} at {price} dollars each and pays with {bill} dollars. "
        "How many dollars of change does "
        f"{name} get?",
        str(bill - count * price),
    )


def _stock(rng: random.Random) -> Problem:
    start, out, new = rng.randint(40, 400), rng.randint(5, 39), rng.randint(5, 120)
    place, thing = rng.choice(
        [
            ("library", "books"),
            ("farm", "sheep"),
            ("shop", "boxes"),
            ("school", "chairs"),
        ]
    )
    return (
        f"A {place} has {start} {thing}. It gives away {out} and then receives {new} more. "
        f"How many {thing} does it have now?",
        str(start - out + new),
    )


def _share(rng: random.Random) -> Problem:
    people = rng.randint(2, 12)
    total = rng.randint(people + 1, 10 * people)
    return (
        f"{total} liters of juice are shared equally among {people} people. "
        "How many liters does each person get?",
        latex_number(Fraction(total, people)),
    )


def _fraction_of(rng: random.Random) -> Problem:
    d = rng.randint(2, 9)
    n = rng.randint(1, d - 1)
    whole = rng.randint(2, 60)
    return (
        f"What is $\\frac{{{n}}}{{{d}}}$ of {whole}?",
        latex_number(Fraction(n, d) * whole),
    )


def _fraction_sum(rng: random.Random) -> Problem:
    a, b = (
        Fraction(rng.randint(1, 9), rng.randint(2, 9)),
        Fraction(rng.randint(1, 9), rng.randint(2, 9)),
    )
    op = rng.choice(["+", "-"])
    value = a + b if op == "+" else a - b
    return (
        f"Compute ${latex_number(a)} {op} {latex_number(b)}$ and give the answer as a reduced fraction "
        "or an integer.",
        latex_number(value),
    )


def _percent(rng: random.Random) -> Problem:
    p = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 75, 80])
    n = rng.randint(2, 50) * 4
    return f"What is {p}% of {n}?", latex_number(Fraction(p * n, 100))


def _linear(rng: random.Random) -> Problem:
    a = rng.choice([k for k in range(-9, 10) if k not in (-1, 0, 1)])
    b, c = rng.randint(-20, 20), rng.randint(-30, 30)
    lhs = f"{a}x" + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")
    return f"Solve for $x$: ${lhs} = {c}$.", latex_number(Fraction(c - b, a))


def _system(rng: random.Random) -> Problem:
    x, y = rng.randint(-10, 20), rng.randint(-10, 20)
    return (
        f"If $x + y = {x + y}$ and $x - y = {x - y}$, what is $x \\cdot y$?",
        str(x * y),
    )


def _mean(rng: random.Random) -> Problem:
    values = [rng.randint(1, 30) for _ in range(rng.randint(3, 6))]
    return (
        f"What is the mean of the numbers {', '.join(map(str, values))}?",
        latex_number(Fraction(sum(values), len(values))),
    )


def _speed(rng: random.Random) -> Problem:
    hours = rng.randint(2, 8)
    km = rng.randint(hours * 5, hours * 40)
    who = rng.choice(["A cyclist", "A runner", "A boat", "A bus"])
    return (
        f"{who} covers {km} km in {hours} hours at a constant speed. What is the speed in km per hour?",
        latex_number(Fraction(km, hours)),
    )


def _expand(rng: random.Random) -> Problem:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    sa, sb = rng.choice([1, -1]), rng.choice([1, -1])
    p, q = sa * a, sb * b

    def factor(k: int) -> str:
        return f"(x + {k})" if k > 0 else f"(x - {-k})"

    return (
        f"Expand ${factor(p)}{factor(q)}$.",
        latex_polynomial([1, p + q, p * q]),
    )


def _surd(rng: random.Random) -> Problem:
    k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10])
    return f"Simplify $\\sqrt{{{k * k * m}}}$.", f"{k}\\sqrt{{{m}}}"


def _series(rng: random.Random) -> Problem:
    lo = rng.randint(1, 30)
    hi = lo + rng.randint(5, 60)
    return (
        f"What is the sum of all integers from {lo} to {hi}, inclusive?",
        str((lo + hi) * (hi - lo + 1) // 2),
    )


def _powers(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 10), rng.randint(1, 5)
    c, d = rng.randint(2, 6), rng.randint(1, 4)
    return f"Evaluate ${a}^{{{b}}} - {c}^{{{d}}}$.", str(a**b - c**d)


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "shop": _shop,
    "stock": _stock,
    "share": _share,
    "fraction_of": _fraction_of,
    "fraction_sum": _fraction_sum,
    "percent": _percent,
    "linear": _linear,
    "system": _system,
    "mean": _mean,
    "speed": _speed,
    "expand": _expand,
    "surd": _surd,
    "series": _series,
    "powers": _powers,
}


def generate_math_tasks(num: int, seed: int = 0) -> list[dict[str, str]]:
    """``num`` distinct problems cycling through the templates: ``{id, kind, split, problem, answer}`` rows."""
    if num < 1:
        raise InvalidInputError(f"num must be >= 1, got {num}")
    rng = random.Random(seed)
    kinds = list(TEMPLATES)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 100 * num:
            raise TaskGenerationError(f"could not draw {num} distinct problems")
        kind = kinds[len(rows) % len(kinds)]
        problem, answer = TEMPLATES[kind](rng)
        if problem in seen:
            continue
        seen.add(problem)
        index = len(rows)
        rows.append(
            {
                "id": f"math-{index:04d}",
                "kind": kind,
                "split": "val" if index % VAL_EVERY == VAL_EVERY - 1 else "train",
                "problem": problem,
                "answer": answer,
            }
        )
    return rows


def write_jsonl(path: str | Path, rows: list[dict[str, str]]) -> Path:
    """One JSON object per line (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m roll_async.envs.math_data", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--num", type=int, default=SHIPPED_NUM)
    parser.add_argument("--seed", type=int, default=SHIPPED_SEED)
    parser.add_argument("--out", required=True, help="output JSONL path")
    args = parser.parse_args(argv)
    out = write_jsonl(args.out, generate_math_tasks(args.num, args.seed))
    print(f"wrote {args.num} problems to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
