"""Find the final answer in a model's reply and check it against a reference with math-verify, in bounded time.

Rewarding math by string match fails on equal forms (``0.5``, ``1/2``,
``\\frac{1}{2}``), so the check is symbolic (the ``math-verify`` library). A
symbolic check can hang on pathological input (``9^{9^{9^{9}}}``), and
math-verify's own time-out uses ``signal.alarm``, which only works in a main
thread, while envs run in worker threads; so the check runs in a small pool of
helper processes (:mod:`roll_async.envs.subprocess_pool`) and a check past its
time limit kills its helper and comes back as a ``timeout`` outcome, never an
exception or a stuck worker. Extraction stays in the caller: it is plain string
scanning, linear in the reply's length.

One grading rule keeps a policy from hedging: **a reply is correct only if every
value it states is.** Each outermost ``\\boxed{}`` and each answer tag is a stated
answer and each must verify; and every number in them must count (math-verify
reads only part of some answers: the right side of ``3 = 5``, the last line of
``6 \\\\ 5``, the ``5`` of ``6 \\text{ (or } 5)``), which is checked by changing each
number and requiring the verdict to change. Otherwise the reply is ``ambiguous``
and scores as wrong.

A second rule keeps a policy from boxing the work instead of the result: **a
correct answer must be in final form** (:func:`final_form`), or it is
``not_final`` and scores as wrong. math-verify accepts any equal form, so
``2 + 3`` for "What is 2 + 3?" or ``(x + 3)(x - 2)`` for "Expand $(x + 3)(x - 2)$"
would verify. An answer whose normalised form (no whitespace, ``$``,
``\\left``/``\\right``, thin spaces or surrounding braces; ``\\cdot``, ``\\times``
and ``*`` alike) equals the reference's is always final; otherwise:

1. an answer (other than a plain number) that is a piece of the question's text is
   not final: it is the question's own expression;
2. when the reference is a plain number (integer, decimal or fraction, signed), the
   answer must be one too: an integer, a decimal (``12,000`` style thousands
   allowed) or a fraction in lowest terms (``1/2``, ``\\frac{1}{2}``; ``2/4`` and
   ``10/2`` are unevaluated divisions, not final), optionally with ``x =`` before
   it and a percent sign, ``^\\circ`` or unit words (``\\text{ apples}``) after it;
3. otherwise the answer may not use any operator (``+``/``-`` but a leading sign,
   multiplication written or implied, division or ``\\frac``, ``^``, roots,
   brackets, any other LaTeX command) more times than the reference does, and a
   root of a whole number must be square-free (``\\sqrt{72}`` is not ``6\\sqrt{2}``
   simplified).

Which failures are whose (the env turns them into rewards or errors):

* the answer is wrong, unreadable, ambiguous, not final, too long, or its check runs past
  the time limit (the helper is killed), or the library raises on it: the
  answer's doing, graded wrong (0), counted by status;
* the helper cannot start, dies while checking (a signal, the OOM killer) or
  breaks the line protocol: the grader failed, not the answer; raised as
  :class:`VerifierUnavailable`, so the episode ends ``env_error`` (not trained
  on, counted, its seat re-run) instead of a 0 the policy did not earn.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_async.envs.subprocess_pool import (
    PoolCallTimeout,
    PoolWorkerFailed,
    SubprocessPool,
    close_at_exit,
    serve_json_lines,
)
from roll_async.errors import InvalidInputError, RollAsyncError

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
#: Longest answer (all the answers a reply states, together) sent to the verifier; longer counts as unparsed.
MAX_ANSWER_CHARS = 1000
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
#: Digits that name rather than count: of a subscript (``a_1``, ``x_{12}``) or of a unit's exponent
#: (``\\text{ cm}^2``, which math-verify drops with the unit); number_variants leaves them alone.
_SUBSCRIPT = re.compile(r"_\s*(?:\{[^{}]*\}|\d)")
_UNIT_GROUP = re.compile(
    r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}]*\}\s*\^\s*(\{[^{}]*\}|\d)"
)


class VerifierUnavailable(RollAsyncError, RuntimeError):
    """The verifier's helper could not start, died while checking, or broke the protocol: a grader failure.

    Raised, not graded: the env step fails and the episode ends ``env_error`` (re-run), since a 0 here
    would train the policy on the grader's fault.
    """


class VerifyStatus(enum.StrEnum):
    """How one answer was judged; only ``CORRECT`` earns a reward."""

    CORRECT = "correct"
    WRONG = "wrong"
    #: The answer is not a math expression math-verify can read (malformed LaTeX, prose, too long).
    UNPARSED = "unparsed"
    #: The reply states more than one value (two different boxes or answer tags, or a number the verifier
    #: does not read, as in ``3 = 5``) and not every one is correct: a hedge, graded wrong.
    AMBIGUOUS = "ambiguous"
    #: The answer equals the reference but is not in final form (the question's own expression, an
    #: unevaluated number or expression; see :func:`final_form`): the work, not the result, graded wrong.
    NOT_FINAL = "not_final"
    #: The reference answer itself cannot be read: a dataset problem, not the model's.
    REFERENCE_UNPARSED = "reference_unparsed"
    #: The check ran past its time limit and was killed.
    TIMEOUT = "timeout"
    #: The verifier library raised on this answer: it could not be verified, graded wrong.
    ERROR = "error"


@dataclass
class VerifyOutcome:
    status: VerifyStatus
    detail: str = ""

    @property
    def correct(self) -> bool:
        return self.status is VerifyStatus.CORRECT


# ---- extraction ----------------------------------------------------------------------------------


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (and ``\\fbox{...}``) in order, nested braces kept whole.

    An unclosed box is left out. Escaped braces (``\\{``) do not count as nesting.
    """
    return [content for _, content in _boxes(text)]


def _boxes(text: str) -> list[tuple[int, str]]:
    """(end position, content) of every closed box, in the order they close; one pass over the text."""
    content_starts = {m.end() for m in _BOXED.finditer(text)}
    found: list[tuple[int, str]] = []
    open_boxes: list[
        tuple[int, int]
    ] = []  # (content start, brace depth inside the box)
    depth, i = 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
            if i + 1 in content_starts:
                open_boxes.append((i + 1, depth))
        elif ch == "}":
            if open_boxes and open_boxes[-1][1] == depth:
                start, _ = open_boxes.pop()
                found.append((i + 1, text[start:i]))
            depth = max(0, depth - 1)
        i += 1
    return found


def stated_answers(text: str, tag: re.Pattern[str] | None = None) -> list[str]:
    """Every answer a reply states, in the order they end: each outermost ``\\boxed{...}``, and each
    ``<answer>...</answer>`` with no box inside (a boxed answer tag states its boxes).

    Math delimiters (``$...$``, ``\\(...\\)``) and boxes around a whole answer are dropped; empty ones
    are left out. ``tag`` is a regex with one group for the tagged form (default ``<answer>(.*?)</answer>``).
    """
    text = text or ""
    boxes = [(end - 1 - len(content), end, content) for end, content in _boxes(text)]
    outermost = [
        (start, end, content)
        for start, end, content in boxes
        if not any(
            s0 < start and end <= e0 or s0 <= start and end < e0 for s0, e0, _ in boxes
        )
    ]
    found = [(end, content) for _, end, content in outermost]
    for match in (tag or _ANSWER_TAG).finditer(text):
        if not any(match.start() <= start < match.end() for start, _, _ in outermost):
            found.append((match.end(), match.group(1) or ""))
    answers = (_unbox(strip_math_delimiters(content)) for _, content in sorted(found))
    return [answer for answer in answers if answer]


def extract_answer(text: str, tag: re.Pattern[str] | None = None) -> str | None:
    """The final answer of a reply: the last of its :func:`stated_answers`; None when it states none.

    ``<answer>\\boxed{3}</answer>`` gives ``3``; ``first \\boxed{5}, final <answer>6</answer>`` gives ``6``
    (whether the reply is graded correct also depends on the 5: see :func:`check_answer`).
    """
    answers = stated_answers(text, tag)
    return answers[-1] if answers else None


def _unbox(text: str) -> str:
    """``\\boxed{\\boxed{x}}`` -> ``x``: drop boxes that wrap the whole text."""
    while True:
        boxes = _boxes(text)
        match = _BOXED.match(text)
        if not (match and boxes and boxes[-1][0] == len(text)):
            return text
        if len(boxes[-1][1]) != len(text) - match.end() - 1:
            return text
        text = boxes[-1][1].strip()


def strip_math_delimiters(text: str) -> str:
    """``$x$``, ``$$x$$``, ``\\(x\\)``, ``\\[x\\]`` -> ``x`` (outer pair only), whitespace trimmed."""
    text = text.strip()
    for left, right in _DELIMITERS:
        if (
            len(text) > len(left) + len(right)
            and text.startswith(left)
            and text.endswith(right)
        ):
            return text[len(left) : -len(right)].strip()
    return text


def reference_answer(text: str) -> str:
    """A dataset's reference answer as the bare expression (a boxed or delimited reference is unwrapped)."""
    boxes = boxed_contents(str(text))
    return _unbox(strip_math_delimiters(boxes[-1] if boxes else str(text)))


# ---- verification (runs inside a helper process) ------------------------------------------------------


def check_answer(
    reference: str, answers: str | Sequence[str], question: str = ""
) -> VerifyStatus:
    """Judge a reply's stated answers against ``reference`` with math-verify, unbounded in time: call it in
    a helper only.

    The last answer is the reply's answer (``UNPARSED`` / ``WRONG`` / ``CORRECT``); a correct one is
    ``AMBIGUOUS`` unless every stated answer verifies and every number in them counts (the verdict changes
    when the number does), and a correct one is ``NOT_FINAL`` unless every stated answer is in
    :func:`final_form` for ``question`` (the problem's text). Each is a bare expression (as :func:`stated_answers` and
    :func:`reference_answer` give them), read as the content of a ``\\boxed{}``.
    """
    # Heavy (sympy, antlr): imported only in the helper processes that run the checks.
    from math_verify import parse, verify

    def read(expr: str) -> list[Any]:
        parsed: list[Any] = parse(
            "\\boxed{" + expr + "}", fallback_mode="no_fallback", parsing_timeout=None
        )
        return parsed

    def correct(expr: str) -> bool:
        parsed = read(expr)
        return bool(parsed) and bool(verify(gold, parsed, timeout_seconds=None))

    answers = [answers] if isinstance(answers, str) else list(answers)
    gold = read(reference)
    if not gold:
        return VerifyStatus.REFERENCE_UNPARSED
    parsed = read(answers[-1])
    if not parsed:
        return VerifyStatus.UNPARSED
    if not verify(gold, parsed, timeout_seconds=None):
        return VerifyStatus.WRONG
    for answer in answers:
        if answer != answers[-1] and not correct(answer):
            return VerifyStatus.AMBIGUOUS
        if any(correct(variant) for variant in number_variants(answer)):
            return VerifyStatus.AMBIGUOUS
    if not all(final_form(answer, reference, question) for answer in answers):
        return VerifyStatus.NOT_FINAL
    return VerifyStatus.CORRECT


def number_variants(answer: str) -> Iterator[str]:
    """``answer`` with one of its numbers changed (a 9 put in front), once per number that should count.

    Digits of a subscript (``a_1``) or of a unit's exponent (``\\text{ cm}^2``) name rather than count
    and are left alone.
    """
    skip = [m.span() for m in _SUBSCRIPT.finditer(answer)]
    skip += [m.span(1) for m in _UNIT_GROUP.finditer(answer)]
    for match in _NUMBER.finditer(answer):
        if any(start <= match.start() < end for start, end in skip):
            continue
        yield answer[: match.start()] + "9" + answer[match.start() :]


# ---- final form (plain string rules; see the module docstring) ------------------------------------

_SPACING = re.compile(r"\s+|\\\$|\$|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[,;:! ]")
_TIMES = re.compile(r"\\cdot(?![A-Za-z])|\\times(?![A-Za-z])")
_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_TEXT = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname)\{([^{}]*)\}")
#: A plain number: sign, then an integer (thousands commas allowed), a decimal or a fraction of integers.
_NUMBER_LITERAL = (
    r"(?P<sign>[+-]?)(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
    r"|\\frac\{(?P<fsign>[+-]?)(?P<fn>\d+)\}\{(?P<fd>\d+)\}|(?P<sn>\d+)/(?P<sd>\d+))"
)
_PLAIN_NUMBER = re.compile(_NUMBER_LITERAL)
#: ... followed by a percent sign, degrees or unit words (``km/h``, ``cm^2``).
_NUMBER_WITH_UNITS = re.compile(
    _NUMBER_LITERAL
    + r"(?:\\?%|\^\{?\\circ\}?|[A-Za-z]+(?:/[A-Za-z]+)?(?:\^\{?\d\}?)?)*"
)
#: ``x =`` (or ``a_1 =``) before a plain number answer.
_NAME_EQUALS = re.compile(r"[A-Za-z]+(?:_\{?\w+\}?)?=")
_OPERATORS = {
    "add": re.compile(r"(?<!^)[+-]"),
    "multiply": re.compile(r"\*|(?<=[\d})\]])(?=[A-Za-z\\(\[])"),
    "divide": re.compile(r"/|\\frac(?![A-Za-z])"),
    "power": re.compile(r"\^"),
    "root": re.compile(r"\\sqrt(?![A-Za-z])"),
    "bracket": re.compile(r"[(\[]|\\\{"),
    "factorial": re.compile(r"!"),
}
_COMMAND = re.compile(r"\\(?!(?:frac|sqrt)(?![A-Za-z]))[A-Za-z]+")
#: A root of a number, or of arithmetic on numbers only (``\\sqrt{36*2}``).
_ROOT_OF_NUMBER = re.compile(r"\\sqrt\{([\d+*/^.-]+)\}|\\sqrt(\d)")


def normalise_math(text: str) -> str:
    """``text`` with spacing, ``$``, ``\\left``/``\\right`` and surrounding braces dropped and every
    multiplication sign written ``*``, ``\\dfrac`` as ``\\frac``: the form the final-form rules compare."""
    text = _SPACING.sub("", _FRAC.sub(r"\\frac", _TIMES.sub("*", text or "")))
    while text.startswith("{") and text.endswith("}") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "{}" and i and text[i - 1] == "\\":
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _plain_number(text: str, units: bool) -> bool:
    """Whether normalised ``text`` is one plain number literal, a fraction in lowest terms (with
    ``units``: allowing ``x =`` before it and a percent sign, degrees or unit words after it)."""
    if units:
        text = _SPACING.sub("", _TEXT.sub(r"\1", text))
        text = text[m.end() :] if (m := _NAME_EQUALS.match(text)) else text
    match = (_NUMBER_WITH_UNITS if units else _PLAIN_NUMBER).fullmatch(text)
    if not match:
        return False
    num = match.group("fn") or match.group("sn")
    den = match.group("fd") or match.group("sd")
    if num is None:
        return True
    if match.group("sign") and match.group("fsign"):
        return False
    return int(den) > 1 and math.gcd(int(num), int(den)) == 1


def _operator_counts(text: str) -> dict[str, int]:
    counts = {kind: len(op.findall(text)) for kind, op in _OPERATORS.items()}
    counts["command"] = len(_COMMAND.findall(text))
    return counts


def final_form(answer: str, reference: str, question: str = "") -> bool:
    """Whether a (correct) ``answer`` states the result rather than the work: the rules of the module
    docstring. ``question`` is the problem's text ("" when unknown: rule 1 is then skipped)."""
    norm, ref = normalise_math(answer), normalise_math(reference)
    if norm == ref:
        return True
    number = _plain_number(norm, units=True)
    if question and not number and norm in normalise_math(question):
        return False  # 1: the question's own expression
    if _plain_number(ref, units=False):
        return number  # 2: a plain number's answer is a plain number
    have, allowed = _operator_counts(norm), _operator_counts(ref)
    if any(have[kind] > allowed[kind] for kind in have):
        return False  # 3: more operations than the result needs
    return all(_square_free(a or b) for a, b in _ROOT_OF_NUMBER.findall(norm))


def _square_free(radicand: str) -> bool:
    """Whether ``radicand`` is a whole number with no square factor (a root of it is simplified); past
    ``10**12`` it is not searched (bounded time) and counts as not simplified."""
    if not radicand.isdigit() or not 0 < int(radicand) <= 10**12:
        return False
    n = int(radicand)
    return not any(n % (k * k) == 0 for k in range(2, math.isqrt(n) + 1))


def _handle_request(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": check_answer(
            str(request["reference"]),
            [str(a) for a in request["answers"]],
            str(request.get("question") or ""),
        ).value
    }


def serve_verifier() -> None:
    """Entry point of a helper process: answer ``{"reference", "answer"}`` lines with ``{"status"}`` lines."""
    # math-verify warns on every call that its own (signal) time-out is off: the pool bounds the time.
    logging.disable(logging.WARNING)
    # Imported before answering ready: a helper without math-verify fails to start (VerifierUnavailable)
    # instead of answering every request with an error.
    import math_verify  # noqa: F401

    serve_json_lines(_handle_request)


# ---- the bounded check the envs call ---------------------------------------------------------------

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_HELPER_COMMAND = (
    sys.executable,
    "-c",
    "from roll_async.envs.math_answers import serve_verifier; serve_verifier()",
)
_pools: dict[int, SubprocessPool] = {}
_pools_lock = threading.Lock()


def verifier_pool(max_workers: int = 2) -> SubprocessPool:
    """This process's pool of verifier helpers with ``max_workers`` children, shared by every math env."""
    with _pools_lock:
        pool = _pools.get(max_workers)
        if pool is None:
            env = dict(os.environ)
            # The helper imports roll_async the way this process found it, installed or not.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
            )
            pool = close_at_exit(
                SubprocessPool(_HELPER_COMMAND, max_workers=max_workers, env=env)
            )
            _pools[max_workers] = pool
        return pool


def verify_answer(
    reference: str,
    answers: str | Sequence[str],
    timeout_s: float = 5.0,
    pool: SubprocessPool | None = None,
    question: str = "",
) -> VerifyOutcome:
    """Judge a reply's stated answers (the last is its answer; see :func:`check_answer`) against
    ``reference`` within ``timeout_s`` seconds; ``question``, the problem's text, lets the final-form
    rule reject the question's own expression boxed back.

    Never raises for bad input (too long, unreadable, hanging: graded outcomes); raises
    :class:`VerifierUnavailable` when the helper could not start, died or broke the protocol.
    """
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise InvalidInputError("verify_answer needs at least one answer")
    if sum(len(a) for a in answers) > MAX_ANSWER_CHARS:
        return VerifyOutcome(
            VerifyStatus.UNPARSED, f"longer than {MAX_ANSWER_CHARS} characters"
        )
    pool = pool or verifier_pool()
    try:
        reply = pool.call(
            {"reference": reference, "answers": answers, "question": question},
            timeout_s,
        )
    except PoolCallTimeout:
        return VerifyOutcome(VerifyStatus.TIMEOUT, f"not checked within {timeout_s:g}s")
    except PoolWorkerFailed as e:
        raise VerifierUnavailable(f"the math verifier failed: {e}") from None
    try:
        status: Any = reply.get("status")  # the enum rejects a missing or unknown one
        return VerifyOutcome(VerifyStatus(status))
    except ValueError:
        return VerifyOutcome(VerifyStatus.ERROR, str(reply.get("error") or reply))
