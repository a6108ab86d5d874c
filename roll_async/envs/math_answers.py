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
"""

from __future__ import annotations

import enum
import logging
import os
import re
import sys
import threading
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

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
#: Longest answer sent to the verifier; a longer one counts as unparsed.
MAX_ANSWER_CHARS = 1000


class VerifyStatus(enum.StrEnum):
    """How one answer was judged; only ``CORRECT`` earns a reward."""

    CORRECT = "correct"
    WRONG = "wrong"
    #: The answer is not a math expression math-verify can read (malformed LaTeX, prose, too long).
    UNPARSED = "unparsed"
    #: The reference answer itself cannot be read: a dataset problem, not the model's.
    REFERENCE_UNPARSED = "reference_unparsed"
    #: The check ran past its time limit and was killed.
    TIMEOUT = "timeout"
    #: The helper process died or misbehaved.
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


def extract_answer(text: str, tag: re.Pattern[str] | None = None) -> str | None:
    """The final answer of a reply: the last ``\\boxed{...}`` or ``<answer>...</answer>``, whichever ends later.

    A box inside the answer tag is unwrapped (``<answer>\\boxed{3}</answer>`` gives
    ``3``), and math delimiters around the answer (``$...$``, ``\\(...\\)``) are
    dropped. ``tag`` is a regex with one group for the tagged form (default
    ``<answer>(.*?)</answer>``). Returns None when there is no answer or it is empty.
    """
    text = text or ""
    candidates = _boxes(text)[-1:]
    tagged = list((tag or _ANSWER_TAG).finditer(text))
    if tagged:
        inner = tagged[-1].group(1) or ""
        inner_boxes = boxed_contents(inner)
        candidates.append((tagged[-1].end(), inner_boxes[-1] if inner_boxes else inner))
    if not candidates:
        return None
    answer = _unbox(strip_math_delimiters(max(candidates, key=lambda c: c[0])[1]))
    return answer or None


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


def check_answer(reference: str, answer: str) -> VerifyStatus:
    """Judge ``answer`` against ``reference`` with math-verify, unbounded in time: call it in a helper only.

    Both are bare expressions (as :func:`extract_answer` and :func:`reference_answer`
    give them); each is read as the content of a ``\\boxed{}``. An expression
    math-verify cannot read is ``UNPARSED`` (``REFERENCE_UNPARSED`` for the reference).
    """
    # Heavy (sympy, antlr): imported only in the helper processes that run the checks.
    from math_verify import parse, verify

    def read(expr: str) -> list[Any]:
        return parse(
            "\\boxed{" + expr + "}", fallback_mode="no_fallback", parsing_timeout=None
        )

    gold = read(reference)
    if not gold:
        return VerifyStatus.REFERENCE_UNPARSED
    parsed = read(answer)
    if not parsed:
        return VerifyStatus.UNPARSED
    ok = verify(gold, parsed, timeout_seconds=None)
    return VerifyStatus.CORRECT if ok else VerifyStatus.WRONG


def _handle_request(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": check_answer(str(request["reference"]), str(request["answer"])).value
    }


def serve_verifier() -> None:
    """Entry point of a helper process: answer ``{"reference", "answer"}`` lines with ``{"status"}`` lines."""
    # math-verify warns on every call that its own (signal) time-out is off: the pool bounds the time.
    logging.disable(logging.WARNING)
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
    answer: str,
    timeout_s: float = 5.0,
    pool: SubprocessPool | None = None,
) -> VerifyOutcome:
    """Judge ``answer`` against ``reference`` within ``timeout_s`` seconds; never raises for bad input."""
    if len(answer) > MAX_ANSWER_CHARS:
        return VerifyOutcome(
            VerifyStatus.UNPARSED, f"longer than {MAX_ANSWER_CHARS} characters"
        )
    pool = pool or verifier_pool()
    try:
        reply = pool.call({"reference": reference, "answer": answer}, timeout_s)
    except PoolCallTimeout:
        return VerifyOutcome(VerifyStatus.TIMEOUT, f"not checked within {timeout_s:g}s")
    except PoolWorkerFailed as e:
        return VerifyOutcome(VerifyStatus.ERROR, str(e))
    try:
        return VerifyOutcome(VerifyStatus(reply.get("status")))
    except ValueError:
        return VerifyOutcome(VerifyStatus.ERROR, str(reply.get("error") or reply))
