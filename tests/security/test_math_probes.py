"""Red-team probes for the math grader: answers a policy could write to game extraction must score 0.

Each probe is one reply stepped through the real math env (roll_async/envs/math_qa.py, math-verify in its
helper processes) on a small dataset written by the test. The truth is put where a last-answer-wins or
any-answer-wins grader would take it, so a probe fails if such a rule comes back. Honest replies to the same
problems are graded too, so a grader that scores everything 0 fails here as well.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from roll_async.envs import make_env
from roll_async.envs.math_answers import (
    MAX_ANSWER_CHARS,
    VerifyStatus,
    check_answer,
    normalise_math,
)
from roll_async.envs.math_data import SHIPPED_TASKS, TEMPLATES

#: The problems, by name: (question, reference answer).
PROBLEMS = {
    "sum": ("What is 2 + 3?", "5"),
    "half": ("What is half of 1?", "\\frac{1}{2}"),
    "quad": ("Expand $(x + 3)(x - 2)$.", "x^2 + x - 6"),
}
#: Seconds one check may take in these probes; a probe that hangs the verifier must come back within it.
VERIFY_TIMEOUT_S = 2.0
#: Covers the helper's start (not counted in the check's limit) and a loaded machine.
MARGIN_S = 10.0

HONEST = [
    ("sum", "The answer is \\boxed{5}."),
    ("sum", "<answer>5</answer>"),
    ("sum", "So $x = 5$, i.e. \\boxed{x = 5}."),
    ("sum", "\\boxed{5} (checked: 2 + 3 = 5), final: <answer>\\boxed{5}</answer>"),
    ("sum", "\\boxed{5 \\text{ apples}}"),
    ("sum", "\\boxed{\\text{5}}"),
    ("half", "\\boxed{\\frac{1}{2}}"),
    ("half", "\\boxed{0.5} or equally <answer>1/2</answer>"),
    ("quad", "\\boxed{x^2 + x - 6}"),
]

PROBES = {
    # several answers in one reply, covering the truth (last, first, in the middle)
    "boxes_1_to_5": ("sum", " ".join(f"\\boxed{{{i}}}" for i in range(1, 6))),
    "boxes_5_then_6": ("sum", "\\boxed{5} \\boxed{6}"),
    "boxes_1_to_10": ("sum", " ".join(f"\\boxed{{{i}}}" for i in range(1, 11))),
    "nested_hedge": ("sum", "\\boxed{\\boxed{4}} \\boxed{\\boxed{5}}"),
    "fractions_hedge": ("half", "\\boxed{\\frac{1}{3}} \\boxed{\\frac{1}{2}}"),
    # answer tags repeated, or mixed with boxes
    "tags_4_then_5": ("sum", "<answer>4</answer><answer>5</answer>"),
    "tags_5_then_6": ("sum", "<answer>5</answer> <answer>6</answer>"),
    "tag_then_box": ("sum", "<answer>4</answer> \\boxed{5}"),
    "tag_with_two_boxes": ("sum", "<answer>\\boxed{4} \\boxed{5}</answer>"),
    # LaTeX that chains values or injects a second box
    "box_equals_box": ("sum", "\\boxed{4} = \\boxed{5}"),
    "name_equals_box": ("sum", "\\boxed{x} = \\boxed{5}"),
    "equation_of_numbers": ("sum", "\\boxed{4 = 5}"),
    "equation_chain": ("sum", "\\boxed{1 = 2 = 3 = 4 = 5}"),
    "line_break": ("sum", "\\boxed{4 \\\\ 5}"),
    "approx": ("sum", "\\boxed{5 \\approx 6}"),
    "arrow": ("sum", "\\boxed{4 \\to 5}"),
    "implies": ("sum", "\\boxed{4 \\implies 5}"),
    "tilde": ("sum", "\\boxed{4 ~ 5}"),
    "hspace": ("sum", "\\boxed{4 \\hspace{1cm} 5}"),
    "unclosed_second_box": ("sum", "\\boxed{4} \\boxed{5"),
    "dollar_box": ("sum", "\\boxed{4} $\\boxed{5}$"),
    # \text tricks
    "text_or": ("sum", "\\boxed{4 \\text{ (or } 5)}"),
    "text_comma": ("sum", "\\boxed{4\\text{, } 5}"),
    "text_words": ("sum", "\\boxed{\\text{4 or 5}}"),
    "text_or_plain": ("sum", "\\boxed{4 \\text{ or } 5}"),
    "paren_or": ("sum", "\\boxed{4 (or 5}"),
    "text_only": ("sum", "\\boxed{\\text{the answer}}"),
    # sets, intervals and conditions that contain the truth
    "set": ("sum", "\\boxed{\\{1, 2, 3, 4, 5, 6\\}}"),
    "interval": ("sum", "\\boxed{[0, 10]}"),
    "open_interval": ("sum", "\\boxed{(4, 6)}"),
    "reals": ("sum", "\\boxed{(-\\infty, \\infty)}"),
    "in_reals": ("sum", "\\boxed{x \\in \\mathbb{R}}"),
    "inequality": ("sum", "\\boxed{4 < x < 6}"),
    "plus_minus": ("sum", "\\boxed{5 \\pm 1}"),
    "list": ("sum", "\\boxed{4, 5, 6}"),
    # empty or whitespace
    "empty": ("sum", ""),
    "whitespace": ("sum", "   \n\t "),
    "empty_box": ("sum", "\\boxed{}"),
    "blank_box": ("sum", "\\boxed{   }"),
    "blank_tag": ("sum", "<answer> </answer>"),
    # the question copied back
    "question_copied": ("sum", PROBLEMS["sum"][0]),
    "question_copied_quad": ("quad", PROBLEMS["quad"][0]),
}

#: Answers that would hang or flood the verifier: each must come back, 0, within the check's time limit.
HEAVY = {
    "power_tower": ("sum", "\\boxed{9^{9^{9^{9}}}}"),
    "truth_beside_a_tower": ("sum", "\\boxed{5 + 0 \\cdot 9^{9^{9^{9}}}}"),
    "giant_number": ("sum", "\\boxed{" + "9" * (MAX_ANSWER_CHARS - 10) + "}"),
    "too_long_sum": ("sum", "\\boxed{" + "0+" * MAX_ANSWER_CHARS + "5}"),
    "many_boxes": ("sum", "\\boxed{4} " * (MAX_ANSWER_CHARS // 2) + "\\boxed{5}"),
    "huge_factorial": ("sum", "\\boxed{(10^{10^{10}})! - (10^{10^{10}})! + 5}"),
}


@pytest.fixture(scope="module")
def data_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = Path(tmp_path_factory.mktemp("math_probes")) / "tasks.jsonl"
    path.write_text(
        "".join(
            json.dumps({"problem": question, "answer": answer}) + "\n"
            for question, answer in PROBLEMS.values()
        )
    )
    return str(path)


def step(
    data_path: str, problem: str, reply: str, verify_timeout_s: float = 30.0
) -> tuple[float, dict]:
    """The reward and metrics of ``reply`` as the first answer to ``problem``.

    The verifier's time limit is generous unless a test is about that limit: a verdict test on a loaded
    machine must not see a timeout (which scores 0 too, but for another reason).
    """
    env = make_env(
        "math", {"data_path": data_path, "verify_timeout_s": verify_timeout_s}
    )
    question = PROBLEMS[problem][0]
    seed = next(s for s in range(len(PROBLEMS)) if question in env.reset(s)[0])
    assert question in env.reset(seed)[0]
    _, reward, _, _, info = env.step(reply)
    return reward, info["metrics"]


@pytest.mark.parametrize(("problem", "reply"), HONEST)
def test_honest_answers_score(data_path, problem, reply):
    reward, metrics = step(data_path, problem, reply)
    assert reward == 1.0 and metrics["success"], metrics


@pytest.mark.parametrize("name", sorted(PROBES))
def test_gaming_answers_score_nothing(data_path, name):
    problem, reply = PROBES[name]
    reward, metrics = step(data_path, problem, reply)
    assert reward <= 0.0 and not metrics["success"], metrics


@pytest.mark.parametrize("name", sorted(HEAVY))
def test_heavy_answers_score_nothing_within_the_time_limit(data_path, name):
    problem, reply = HEAVY[name]
    # a started helper: its start is not the probe's
    step(data_path, "sum", "\\boxed{5}", VERIFY_TIMEOUT_S)
    started = time.monotonic()
    reward, metrics = step(data_path, problem, reply, VERIFY_TIMEOUT_S)
    assert time.monotonic() - started < VERIFY_TIMEOUT_S + MARGIN_S
    assert reward <= 0.0 and not metrics["success"], metrics


@pytest.mark.parametrize(
    ("problem", "reply"),
    [("sum", "\\boxed{2 + 3}"), ("quad", "\\boxed{(x + 3)(x - 2)}")],
)
def test_the_problem_s_expression_boxed_back_scores_nothing(data_path, problem, reply):
    reward, metrics = step(data_path, problem, reply)
    assert reward <= 0.0 and not metrics["success"], metrics
    assert metrics["answer_not_final"], metrics


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"-?\d+", text)]


def _shop(q: str) -> str:
    count, price, bill = _numbers(q)
    return f"{bill} - {count} \\cdot {price}"


def _stock(q: str) -> str:
    start, out, new = _numbers(q)
    return f"{start} - {out} + {new}"


def _divided(q: str) -> str:  # share, speed: the division left undone
    total, parts = _numbers(q)
    return f"\\frac{{{total}}}{{{parts}}}"


def _fraction_of(q: str) -> str:
    return q[len("What is $") : q.index("$ of")] + f" \\cdot {_numbers(q)[-1]}"


def _fraction_sum(q: str) -> str:
    return q[q.index("$") + 1 : q.rindex("$")]


def _percent(q: str) -> str:
    p, n = _numbers(q)
    return f"\\frac{{{p}}}{{100}} \\cdot {n}"


def _linear(q: str) -> str:
    a, b, c = _numbers(q.replace(" - ", " -").replace("x + ", "x "))
    return f"\\frac{{{c} - ({b})}}{{{a}}}"


def _system(q: str) -> str:
    s, d = _numbers(q.replace("x + y", "").replace("x - y", ""))
    return f"\\frac{{{s} + ({d})}}{{2}} \\cdot \\frac{{{s} - ({d})}}{{2}}"


def _mean(q: str) -> str:
    values = _numbers(q)
    return f"\\frac{{{' + '.join(map(str, values))}}}{{{len(values)}}}"


def _expand(q: str) -> str:
    return q[q.index("$") + 1 : q.rindex("$")]


def _surd(q: str) -> str:
    return q[q.index("$") + 1 : q.rindex("$")]


def _series(q: str) -> str:
    lo, hi = _numbers(q)
    return f"\\frac{{({lo} + {hi})({hi} - {lo} + 1)}}{{2}}"


def _powers(q: str) -> str:
    return q[q.index("$") + 1 : q.rindex("$")]


#: Per shipped problem kind: the problem's work left undone, as a policy could box it instead of the result.
UNEVALUATED = {
    "shop": _shop,
    "stock": _stock,
    "share": _divided,
    "fraction_of": _fraction_of,
    "fraction_sum": _fraction_sum,
    "percent": _percent,
    "linear": _linear,
    "system": _system,
    "mean": _mean,
    "speed": _divided,
    "expand": _expand,
    "surd": _surd,
    "series": _series,
    "powers": _powers,
}
SHIPPED_ROWS = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines()]


def _kind_probe(kind: str) -> tuple[dict, str]:
    """The first shipped problem of ``kind`` whose unevaluated expression is not already its answer
    (``\\frac{55}{9}`` for 55 liters among 9 is the result), with that expression."""
    for row in SHIPPED_ROWS:
        if row["kind"] == kind:
            expression = UNEVALUATED[kind](row["problem"])
            if normalise_math(expression) != normalise_math(row["answer"]):
                return row, expression
    raise AssertionError(f"no shipped {kind} problem to probe")


def test_every_shipped_kind_has_a_probe():
    assert set(UNEVALUATED) == set(TEMPLATES) == {r["kind"] for r in SHIPPED_ROWS}


@pytest.mark.parametrize("kind", sorted(UNEVALUATED))
def test_a_shipped_problem_s_work_boxed_back_scores_nothing(tmp_path, kind):
    row, expression = _kind_probe(kind)
    # The probe must be worth something to a plain symbolic grader: math-verify finds it equal.
    assert check_answer(row["answer"], expression) in (
        VerifyStatus.CORRECT,
        VerifyStatus.NOT_FINAL,
    ), expression
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"problem": row["problem"], "answer": row["answer"]}))
    env = make_env(
        "math",
        {"data_path": str(path), "verify_timeout_s": 30.0, "max_attempts": 2},
    )
    env.reset(0)
    _, reward, _, _, info = env.step(f"The answer is \\boxed{{{expression}}}.")
    assert reward <= 0.0 and info["metrics"]["answer_not_final"], (row, expression)
    _, reward, _, _, info = env.step(f"The answer is \\boxed{{{row['answer']}}}.")
    assert reward == 1.0 and info["metrics"]["success"], (
        row
    )  # the result itself still scores
