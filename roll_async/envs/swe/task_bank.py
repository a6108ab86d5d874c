"""The shipped tasks' content: small Python modules with one planted bug each, and their hidden tests.

An agent env needs tasks that run offline, in seconds, with a known answer, so the project writes
its own: every task here is a starting tree, the files the reference fix rewrites, and pytest tests
the agent never sees. Which tests fail before the fix (``fail_to_pass``) and which pass throughout
(``pass_to_pass``) is stated here and checked by the tests (the reference fix scores 1, doing
nothing scores 0). :mod:`.task_bank_shell` adds the shell tasks; :mod:`.shipped` writes them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roll_async.errors import TaskGenerationError

Category = Literal["python_bug", "shell"]


@dataclass(frozen=True)
class BankTask:
    """One shipped task: files at the start, the reference fix, and the hidden tests (one file)."""

    name: str
    category: Category
    instruction: str
    files: dict[str, str]
    #: Files the fix rewrites (whole new content), files it renames (old -> new) and makes executable.
    fixed: dict[str, str] = field(default_factory=dict)
    renames: dict[str, str] = field(default_factory=dict)
    executable: tuple[str, ...] = ()
    tests: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    #: Starting files that are executable.
    modes: dict[str, int] = field(default_factory=dict)

    @property
    def test_file(self) -> str:
        return f"test_{self.name}.py"


def bug_task(
    name: str,
    module: str,
    source: str,
    old: str,
    new: str,
    tests: str,
    fail: tuple[str, ...],
    passing: tuple[str, ...],
    issue: str,
) -> BankTask:
    """A one-module task whose fix replaces ``old`` (which must occur once) with ``new``."""
    if source.count(old) != 1:
        raise TaskGenerationError(
            f"task {name}: the planted bug {old!r} must occur exactly once"
        )
    return BankTask(
        name=name,
        category="python_bug",
        instruction=f"{issue}\n\nThe code is in `{module}.py` in your working directory. Fix the bug; "
        "do not change the function's name or signature.",
        files={f"{module}.py": source},
        fixed={f"{module}.py": source.replace(old, new)},
        tests=tests,
        fail_to_pass=fail,
        pass_to_pass=passing,
    )


PYTHON_TASKS: tuple[BankTask, ...] = (
    bug_task(
        "calc_add",
        "calc",
        "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
        "return a - b\n\n\ndef sub",
        "return a + b\n\n\ndef sub",
        "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n    assert add(-1, 1) == 0\n\n\n"
        "def test_sub():\n    assert sub(5, 3) == 2\n",
        ("test_add",),
        ("test_sub",),
        "`add(2, 3)` returns -1 instead of 5.",
    ),
    bug_task(
        "stats_mean",
        "stats",
        "def mean(values):\n    return sum(values) / (len(values) - 1)\n\n\ndef total(values):\n    return sum(values)\n",
        "(len(values) - 1)",
        "len(values)",
        "from stats import mean, total\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n    assert mean([4]) == 4\n\n\n"
        "def test_total():\n    assert total([1, 2, 3]) == 6\n",
        ("test_mean",),
        ("test_total",),
        "`mean([1, 2, 3])` returns 3.0; the mean is 2.",
    ),
    bug_task(
        "palindrome",
        "strings",
        "def is_palindrome(text):\n    cleaned = [c for c in text if c.isalnum()]\n    return cleaned == cleaned[::-1]\n",
        "[c for c in text if c.isalnum()]",
        "[c.lower() for c in text if c.isalnum()]",
        "from strings import is_palindrome\n\n\ndef test_mixed_case():\n    assert is_palindrome('Racecar')\n"
        "    assert is_palindrome('A man, a plan, a canal: Panama')\n\n\n"
        "def test_plain():\n    assert is_palindrome('abba')\n    assert not is_palindrome('abc')\n",
        ("test_mixed_case",),
        ("test_plain",),
        "`is_palindrome('Racecar')` is False: the check should ignore case.",
    ),
    bug_task(
        "fibonacci",
        "fib",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n + 1):\n        a, b = b, a + b\n    return a\n",
        "range(n + 1)",
        "range(n)",
        "from fib import fib\n\n\ndef test_fib():\n    assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n\n\n"
        "def test_type():\n    assert isinstance(fib(5), int)\n",
        ("test_fib",),
        ("test_type",),
        "`fib(0)` should be 0 and `fib(1)` 1 (the sequence 0, 1, 1, 2, 3, 5, ...), but every value is one step ahead.",
    ),
    bug_task(
        "clamp",
        "bounds",
        "def clamp(value, low, high):\n    return max(high, min(low, value))\n",
        "max(high, min(low, value))",
        "max(low, min(high, value))",
        "from bounds import clamp\n\n\ndef test_clamp():\n    assert clamp(5, 0, 10) == 5\n    assert clamp(-3, 0, 10) == 0\n"
        "    assert clamp(42, 0, 10) == 10\n\n\ndef test_equal_bounds():\n    assert clamp(7, 3, 3) == 3\n",
        ("test_clamp",),
        ("test_equal_bounds",),
        "`clamp(5, 0, 10)` returns 10; it should keep a value that is already inside [low, high].",
    ),
    bug_task(
        "word_count",
        "words",
        "def word_count(text):\n    return len([w for w in text.split(' ') if w])\n",
        "text.split(' ')",
        "text.split()",
        "from words import word_count\n\n\ndef test_whitespace():\n    assert word_count('one\\ttwo\\nthree') == 3\n\n\n"
        "def test_spaces():\n    assert word_count('a  b c') == 3\n    assert word_count('') == 0\n",
        ("test_whitespace",),
        ("test_spaces",),
        "`word_count` counts 'one\\ttwo\\nthree' as one word; tabs and newlines separate words too.",
    ),
    bug_task(
        "binary_search",
        "search",
        "def index_of(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo < hi:\n"
        "        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n"
        "        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
        "while lo < hi:",
        "while lo <= hi:",
        "from search import index_of\n\n\ndef test_found_everywhere():\n    items = [1, 3, 5, 7, 9]\n"
        "    assert [index_of(items, x) for x in items] == [0, 1, 2, 3, 4]\n    assert index_of([4], 4) == 0\n\n\n"
        "def test_missing():\n    assert index_of([1, 3, 5], 4) == -1\n    assert index_of([], 1) == -1\n",
        ("test_found_everywhere",),
        ("test_missing",),
        "`index_of([4], 4)` returns -1 although 4 is in the list.",
    ),
    bug_task(
        "flatten",
        "nested",
        "def flatten(items):\n    out = []\n    for item in items:\n        if isinstance(item, list):\n"
        "            out.extend(item)\n        else:\n            out.append(item)\n    return out\n",
        "out.extend(item)",
        "out.extend(flatten(item))",
        "from nested import flatten\n\n\ndef test_deep():\n    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]\n\n\n"
        "def test_shallow():\n    assert flatten([1, [2, 3]]) == [1, 2, 3]\n",
        ("test_deep",),
        ("test_shallow",),
        "`flatten([1, [2, [3]]])` returns [1, 2, [3]]; lists nested at any depth should be flattened.",
    ),
    bug_task(
        "temperature",
        "units",
        "def c_to_f(celsius):\n    return celsius * 9 / 5 - 32\n\n\ndef f_to_c(fahrenheit):\n    return (fahrenheit - 32) * 5 / 9\n",
        "celsius * 9 / 5 - 32",
        "celsius * 9 / 5 + 32",
        "from units import c_to_f, f_to_c\n\n\ndef test_c_to_f():\n    assert c_to_f(100) == 212\n    assert c_to_f(0) == 32\n\n\n"
        "def test_f_to_c():\n    assert f_to_c(212) == 100\n",
        ("test_c_to_f",),
        ("test_f_to_c",),
        "`c_to_f(0)` returns -32; water freezes at 32 degrees Fahrenheit.",
    ),
    bug_task(
        "dedupe",
        "uniq",
        "def dedupe(items):\n    return list(set(items))\n",
        "return list(set(items))",
        "return list(dict.fromkeys(items))",
        "from uniq import dedupe\n\n\ndef test_order_kept():\n    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]\n    assert dedupe(['b', 'a', 'b']) == ['b', 'a']\n\n\n"
        "def test_empty():\n    assert dedupe([]) == []\n",
        ("test_order_kept",),
        ("test_empty",),
        "`dedupe` must keep the first occurrence of each item in its original order; it scrambles the order.",
    ),
    bug_task(
        "chunks",
        "batching",
        "def chunks(items, size):\n    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]\n",
        "len(items) - size + 1",
        "len(items)",
        "from batching import chunks\n\n\ndef test_remainder():\n    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\n\n\n"
        "def test_exact():\n    assert chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]\n",
        ("test_remainder",),
        ("test_exact",),
        "`chunks([1, 2, 3, 4, 5], 2)` drops the last, shorter chunk [5].",
    ),
    bug_task(
        "roman",
        "numerals",
        "PAIRS = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'),\n"
        "         (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (1, 'I')]\n\n\ndef to_roman(n):\n    out = ''\n"
        "    for value, letters in PAIRS:\n        while n >= value:\n            out += letters\n            n -= value\n    return out\n",
        "(5, 'V'), (1, 'I')]",
        "(5, 'V'), (4, 'IV'), (1, 'I')]",
        "from numerals import to_roman\n\n\ndef test_subtractive_four():\n    assert to_roman(4) == 'IV'\n    assert to_roman(14) == 'XIV'\n\n\n"
        "def test_basic():\n    assert to_roman(1987) == 'MCMLXXXVII'\n",
        ("test_subtractive_four",),
        ("test_basic",),
        "`to_roman(4)` gives 'IIII'; it should be 'IV' (and 14 'XIV').",
    ),
    bug_task(
        "leap_year",
        "calendar_utils",
        "def is_leap(year):\n    return year % 4 == 0 and year % 100 != 0\n",
        "year % 4 == 0 and year % 100 != 0",
        "year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        "from calendar_utils import is_leap\n\n\ndef test_400_rule():\n    assert is_leap(2000)\n    assert is_leap(1600)\n\n\n"
        "def test_common():\n    assert is_leap(2024)\n    assert not is_leap(1900)\n    assert not is_leap(2023)\n",
        ("test_400_rule",),
        ("test_common",),
        "`is_leap(2000)` is False, but 2000 was a leap year (years divisible by 400 are).",
    ),
    bug_task(
        "merge_config",
        "settings",
        "def merge(defaults, overrides):\n    merged = dict(overrides)\n    merged.update(defaults)\n    return merged\n",
        "merged = dict(overrides)\n    merged.update(defaults)",
        "merged = dict(defaults)\n    merged.update(overrides)",
        "from settings import merge\n\n\ndef test_override_wins():\n    assert merge({'a': 1, 'b': 2}, {'b': 3}) == {'a': 1, 'b': 3}\n\n\n"
        "def test_disjoint():\n    assert merge({'a': 1}, {'c': 2}) == {'a': 1, 'c': 2}\n",
        ("test_override_wins",),
        ("test_disjoint",),
        "`merge(defaults, overrides)` lets the defaults win; an override must replace the default value.",
    ),
    bug_task(
        "csv_line",
        "csvline",
        "def parse_line(line):\n    return line.split(',')\n",
        "return line.split(',')",
        "return [field.strip() for field in line.split(',')]",
        "from csvline import parse_line\n\n\ndef test_strips():\n    assert parse_line(' a , b,c ') == ['a', 'b', 'c']\n\n\n"
        "def test_plain():\n    assert parse_line('x,y') == ['x', 'y']\n",
        ("test_strips",),
        ("test_plain",),
        "`parse_line(' a , b')` keeps the spaces around fields; each field should be stripped.",
    ),
    bug_task(
        "factorial",
        "mathx",
        "def factorial(n):\n    if n <= 1:\n        return n\n    return n * factorial(n - 1)\n",
        "        return n\n",
        "        return 1\n",
        "from mathx import factorial\n\n\ndef test_zero():\n    assert factorial(0) == 1\n\n\n"
        "def test_five():\n    assert factorial(5) == 120\n",
        ("test_zero",),
        ("test_five",),
        "`factorial(0)` returns 0; by definition 0! is 1.",
    ),
    bug_task(
        "gcd",
        "divisors",
        "def gcd(a, b):\n    while b:\n        a, b = b, b % a\n    return abs(a)\n",
        "b % a",
        "a % b",
        "from divisors import gcd\n\n\ndef test_gcd():\n    assert gcd(18, 12) == 6\n    assert gcd(12, 18) == 6\n\n\n"
        "def test_gcd_zero():\n    assert gcd(7, 0) == 7\n",
        ("test_gcd",),
        ("test_gcd_zero",),
        "`gcd(18, 12)` returns 12; the greatest common divisor is 6.",
    ),
    bug_task(
        "title_case",
        "titles",
        "def title(text):\n    return ' '.join(w[:1].upper() + w[1:] for w in text.split(' ')[1:])\n",
        "text.split(' ')[1:]",
        "text.split(' ')",
        "from titles import title\n\n\ndef test_all_words():\n    assert title('hello big world') == 'Hello Big World'\n\n\n"
        "def test_empty():\n    assert title('') == ''\n",
        ("test_all_words",),
        ("test_empty",),
        "`title('hello big world')` loses the first word; every word should be capitalised.",
    ),
    bug_task(
        "median",
        "middle",
        "def median(values):\n    ordered = sorted(values)\n    mid = len(ordered) // 2\n    if len(ordered) % 2:\n"
        "        return ordered[mid]\n    return ordered[mid]\n",
        "\n    return ordered[mid]\n",
        "\n    return (ordered[mid - 1] + ordered[mid]) / 2\n",
        "from middle import median\n\n\ndef test_even():\n    assert median([4, 1, 3, 2]) == 2.5\n\n\n"
        "def test_odd():\n    assert median([3, 1, 2]) == 2\n",
        ("test_even",),
        ("test_odd",),
        "`median([1, 2, 3, 4])` returns 3; for an even count the median is the mean of the two middle values.",
    ),
    bug_task(
        "run_length",
        "rle",
        "def encode(text):\n    out = []\n    for ch in text:\n        if out and out[-1][0] == ch:\n"
        "            out[-1][1] += 1\n        else:\n            out.append([ch, 0])\n    return ''.join(f'{n}{c}' for c, n in out)\n",
        "out.append([ch, 0])",
        "out.append([ch, 1])",
        "from rle import encode\n\n\ndef test_counts():\n    assert encode('aaabcc') == '3a1b2c'\n\n\n"
        "def test_empty():\n    assert encode('') == ''\n",
        ("test_counts",),
        ("test_empty",),
        "`encode('aaabcc')` gives '2a0b1c'; each count is one short.",
    ),
    bug_task(
        "slugify",
        "slugs",
        "import re\n\n\ndef slugify(text):\n    return re.sub(r'[^a-z0-9]', '-', text.lower()).strip('-')\n",
        "r'[^a-z0-9]'",
        "r'[^a-z0-9]+'",
        "from slugs import slugify\n\n\ndef test_collapses():\n    assert slugify('Hello,  World!') == 'hello-world'\n\n\n"
        "def test_simple():\n    assert slugify('abc') == 'abc'\n",
        ("test_collapses",),
        ("test_simple",),
        "`slugify('Hello,  World!')` gives 'hello---world'; runs of other characters should become one dash.",
    ),
    bug_task(
        "transpose",
        "matrix",
        "def transpose(rows):\n    return [list(row) for row in rows]\n",
        "[list(row) for row in rows]",
        "[list(col) for col in zip(*rows)]",
        "from matrix import transpose\n\n\ndef test_rect():\n    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]\n\n\n"
        "def test_empty():\n    assert transpose([]) == []\n",
        ("test_rect",),
        ("test_empty",),
        "`transpose([[1, 2, 3], [4, 5, 6]])` returns its input unchanged instead of the transposed matrix.",
    ),
    bug_task(
        "is_prime",
        "primes",
        "def is_prime(n):\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n    return True\n",
        "    return True\n",
        "    return n >= 2\n",
        "from primes import is_prime\n\n\ndef test_small():\n    assert not is_prime(0)\n    assert not is_prime(1)\n\n\n"
        "def test_primes():\n    assert [n for n in range(2, 20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]\n",
        ("test_small",),
        ("test_primes",),
        "`is_prime(1)` is True; 0 and 1 are not prime.",
    ),
    bug_task(
        "vowels",
        "letters",
        "VOWELS = 'aeio'\n\n\ndef count_vowels(text):\n    return sum(1 for ch in text.lower() if ch in VOWELS)\n",
        "VOWELS = 'aeio'",
        "VOWELS = 'aeiou'",
        "from letters import count_vowels\n\n\ndef test_u():\n    assert count_vowels('Up and down') == 3\n\n\n"
        "def test_none():\n    assert count_vowels('rhythm') == 0\n",
        ("test_u",),
        ("test_none",),
        "`count_vowels('Up')` is 0; 'u' is a vowel too.",
    ),
)
