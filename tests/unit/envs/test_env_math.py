"""Math env: answer extraction, math-verify checks in bounded time, retry turns, dataset loading and errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.envs import make_env
from roll_async.envs.dataset import make_env_dataset_rows
from roll_async.envs.math_answers import (
    VerifierUnavailable,
    VerifyStatus,
    extract_answer,
    final_form,
    reference_answer,
    verifier_pool,
    verify_answer,
)
from roll_async.envs.math_data import (
    SHIPPED_NUM,
    SHIPPED_SEED,
    SHIPPED_TASKS,
    generate_math_tasks,
    latex_number,
    latex_polynomial,
)
from roll_async.envs.math_qa import MathQAConfig, MathQAEnv
from roll_async.envs.subprocess_pool import SubprocessPool
from roll_async.errors import ConfigError
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine

#: Needs a time-out: sympy evaluates the tower exactly and never returns.
PATHOLOGICAL = "9^{9^{9^{9}}}"


@pytest.mark.parametrize(
    "reply, answer",
    [
        ("so the result is \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
        ("\\boxed{{2}^{3}} and \\boxed{\\sqrt{\\frac{1}{4}}}", "\\sqrt{\\frac{1}{4}}"),
        ("<answer>1/2</answer>", "1/2"),
        ("<answer> $\\frac{1}{2}$ </answer>", "\\frac{1}{2}"),
        ("<answer>\\boxed{7}</answer>", "7"),
        ("first \\boxed{5}, final <answer>6</answer>", "6"),
        ("<answer>6</answer> wait, \\boxed{\\boxed{5}}", "5"),
        ("\\boxed {\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{42}", "42"),
        ("\\boxed{x", None),
        ("no answer at all", None),
        ("<answer>  </answer>", None),
        ("", None),
    ],
)
def test_extract_answer(reply, answer):
    assert extract_answer(reply) == answer


def test_reference_answer_unwraps_boxes_and_dollars():
    assert reference_answer("$\\boxed{\\frac{1}{2}}$") == "\\frac{1}{2}"
    assert reference_answer("12") == "12"


@pytest.mark.parametrize(
    "reference, answer, status",
    [
        ("\\frac{1}{2}", "0.5", VerifyStatus.CORRECT),
        ("\\frac{1}{2}", "1/2", VerifyStatus.CORRECT),
        ("0.5", "\\frac{1}{2}", VerifyStatus.CORRECT),
        ("\\frac{3}{4}", "\\dfrac{3}{4}", VerifyStatus.CORRECT),
        ("-\\frac{7}{2}", "-3.5", VerifyStatus.CORRECT),
        ("x^2 + x - 6", "-6 + x + x^{2}", VerifyStatus.CORRECT),
        ("6\\sqrt{2}", "\\sqrt{2} \\cdot 6", VerifyStatus.CORRECT),
        # equal, but the work rather than the result: not final (see final_form)
        ("x^2 + x - 6", "(x+3)(x-2)", VerifyStatus.NOT_FINAL),
        ("6\\sqrt{2}", "\\sqrt{72}", VerifyStatus.NOT_FINAL),
        ("5", "10/2", VerifyStatus.NOT_FINAL),
        ("\\frac{1}{2}", "2/4", VerifyStatus.NOT_FINAL),
        ("12000", "12,000", VerifyStatus.CORRECT),
        ("5", "6", VerifyStatus.WRONG),
        ("\\frac{3}{4}", "\\frac{4}{3}", VerifyStatus.WRONG),
        ("5", "\\frac{", VerifyStatus.UNPARSED),
        ("5", "}{", VerifyStatus.UNPARSED),
        ("5", "x" * 2000, VerifyStatus.UNPARSED),
        ("\\frac{", "5", VerifyStatus.REFERENCE_UNPARSED),
    ],
)
def test_verify_answer(reference, answer, status):
    assert verify_answer(reference, answer).status is status


def test_a_check_past_its_time_limit_is_cut_off_and_the_pool_recovers():
    pool = verifier_pool()
    verify_answer(
        "1", "1", pool=pool
    )  # a started helper: the start-up is not part of the limit
    killed = pool.num_killed
    t0 = time.monotonic()
    outcome = verify_answer("5", PATHOLOGICAL, timeout_s=0.5, pool=pool)
    assert outcome.status is VerifyStatus.TIMEOUT
    assert time.monotonic() - t0 < 3.0
    assert pool.num_killed == killed + 1
    assert verify_answer("\\frac{1}{2}", "1/2", pool=pool).correct


def test_env_counts_a_timeout_in_a_worker_thread():
    env = make_env("math", {"verify_timeout_s": 0.5})
    env.reset(0)
    with ThreadPoolExecutor(1) as ex:
        obs, reward, terminated, _, info = ex.submit(
            env.step, f"\\boxed{{{PATHOLOGICAL}}}"
        ).result(timeout=30)
    assert threading.current_thread() is threading.main_thread()
    assert reward == 0.0 and terminated
    assert info["metrics"]["verify_timeout"] and not info["metrics"]["success"]
    assert "in time" in obs


def kill_busy_helper_soon(
    pool: SubprocessPool, after_s: float = 0.3
) -> threading.Thread:
    """SIGKILL the helper that is checking an answer (as the OOM killer would), from another thread."""

    def kill() -> None:
        deadline = time.monotonic() + 60
        while not pool.busy_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after_s)
        for pid in pool.busy_pids():
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_verifier_that_dies_mid_check_raises_instead_of_grading():
    pool = verifier_pool()
    verify_answer("1", "1", pool=pool)  # a started helper
    killer = kill_busy_helper_soon(pool)
    with pytest.raises(VerifierUnavailable, match="helper exited"):
        verify_answer("5", PATHOLOGICAL, timeout_s=60, pool=pool)
    killer.join(5)
    assert verify_answer(
        "\\frac{1}{2}", "1/2", pool=pool
    ).correct  # the next check starts a new helper


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-c", "import sys; sys.exit(3)"],  # exits before ready
        ["/nonexistent/python-for-math-verify"],  # cannot be spawned
    ],
)
def test_a_verifier_that_cannot_start_raises_instead_of_grading(command):
    pool = SubprocessPool(command, max_workers=1, startup_timeout_s=10)
    with pytest.raises(VerifierUnavailable, match="math verifier failed"):
        verify_answer("5", "5", pool=pool)
    pool.close()


async def test_a_verifier_death_ends_the_episode_as_an_env_error_and_the_seat_is_rerun(
    tmp_path,
):
    tokenizer = build_chatml_test_tokenizer()
    path = task_file(tmp_path, [{"problem": "What is 2 + 3?", "answer": "5"}])
    replies = iter([f"\\boxed{{{PATHOLOGICAL}}}", "\\boxed{5}", "\\boxed{5}"])

    def output(request):
        ids = tokenizer.encode(next(replies), add_special_tokens=False)
        return ids + [tokenizer.eos_token_id]

    config = PipelineConfig(
        rollout_batch_size=1,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Math": CustomEnvConfig(
                env_type="math",
                env_config={"data_path": path, "verify_timeout_s": 60.0},
                max_steps=1,
                max_tokens_per_step=64,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Math"], env_step_timeout_s=90.0
        ),
    )
    validate_config(config)
    pool = verifier_pool(2)  # the math env's default verify_workers
    verify_answer("1", "1", pool=pool)
    killer = kill_busy_helper_soon(pool)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"), engines=FakeEngine(output), tokenizer=tokenizer
    )
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 60
        )
    finally:
        await scheduler.shutdown()
    killer.join(5)
    assert metrics["rollout/env_errors"] == 1
    assert sum(m.stats.env_errors for m in scheduler.managers) == 1
    (trajectory,) = batch
    assert trajectory.stop_reason == "terminated" and trajectory.episode_reward == 1.0


def task_file(tmp_path, rows, name="tasks.jsonl"):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_retry_turns(tmp_path):
    path = task_file(
        tmp_path, [{"problem": "What is 1/2 + 1/4?", "answer": "\\frac{3}{4}"}]
    )
    env = make_env("math", {"data_path": path, "max_attempts": 3, "max_steps": 4})
    obs, info = env.reset(0)
    assert obs == "Problem: What is 1/2 + 1/4?" and "3 attempts" in info["instruction"]
    obs, reward, terminated, truncated, info = env.step("\\boxed{0.7}")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "attempts left: 2" in obs and info["metrics"]["action_is_valid"]
    # A turn without an answer costs the format penalty but no attempt.
    obs, reward, terminated, _, info = env.step("hmm")
    assert reward == pytest.approx(-0.1) and not terminated
    assert (
        not info["metrics"]["action_is_valid"] and info["metrics"]["num_attempts"] == 1
    )
    obs, reward, terminated, _, info = env.step(
        "<answer>\\boxed{\\frac{5}{4}}</answer>"
    )
    assert reward == 0.0 and not terminated and "attempts left: 1" in obs
    obs, reward, terminated, _, info = env.step("It is \\boxed{0.75}")
    assert reward == 1.0 and terminated
    assert info["metrics"]["success"] and info["metrics"]["action_is_effective"]
    assert info["metrics"]["num_attempts"] == 3


def test_last_attempt_wrong_ends_the_episode():
    env = make_env("math", {})
    env.reset(1)
    _, reward, terminated, truncated, info = env.step("\\boxed{-123456789}")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert not info["metrics"]["success"] and not info["metrics"]["action_is_effective"]


def test_unparsed_answer_and_unreadable_reference_are_counted(tmp_path):
    env = make_env("math", {"max_attempts": 2})
    env.reset(0)
    obs, reward, terminated, _, info = env.step("<answer>\\frac{</answer>")
    assert reward == 0.0 and not terminated
    assert info["metrics"]["answer_unparsed"] and info["metrics"]["action_is_valid"]
    assert "could not be read" in obs
    path = task_file(tmp_path, [{"problem": "?", "answer": "\\frac{"}])
    env = make_env("math", {"data_path": path, "max_attempts": 2})
    env.reset(0)
    _, reward, terminated, _, info = env.step("\\boxed{1}")
    assert reward == 0.0 and terminated and info["metrics"]["reference_unparsed"]


def test_expert_response_succeeds():
    env = make_env("math", {})
    for seed in (0, 5):
        env.reset(seed)
        _, reward, _, _, info = env.step(env.expert_responses()[0])
        assert reward == 1.0 and info["metrics"]["success"]


def test_seed_picks_the_row_deterministically(tmp_path):
    rows = [{"problem": f"q{i}", "answer": str(i)} for i in range(7)]
    path = task_file(tmp_path, rows)
    a, b = make_env("math", {"data_path": path}), make_env("math", {"data_path": path})
    assert [a.reset(s)[0] for s in range(20)] == [b.reset(s)[0] for s in range(20)]
    first = [a.reset(s)[0] for s in range(7)]
    assert sorted(first) == sorted(f"Problem: q{i}" for i in range(7))
    assert a.reset(7)[0] == first[0]  # seed modulo the number of rows
    other = make_env("math", {"data_path": path, "shuffle_seed": 1})
    assert [other.reset(s)[0] for s in range(7)] != first


@pytest.mark.parametrize("name", ["t.jsonl", "t.parquet"])
def test_custom_columns_from_jsonl_and_parquet(tmp_path, name):
    rows = [
        {"question": "Half of 3?", "final": "\\frac{3}{2}", "part": "train"},
        {"question": "Twice 4?", "final": "8", "part": "val"},
    ]
    path = task_file(tmp_path, rows, name)
    config = {"data_path": path, "question_key": "question", "answer_key": "final"}
    env = make_env("math", {**config, "split": "val", "split_key": "part"})
    assert env.num_tasks == 1 and env.reset(3)[0] == "Problem: Twice 4?"
    assert env.step("\\boxed{8}")[1] == 1.0
    env = make_env("math", config)
    assert env.num_tasks == 2


def test_json_array_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps([{"problem": "1+1?", "answer": 2}])
    )  # a number works too
    env = make_env("math", {"data_path": str(path)})
    assert env.num_tasks == 1
    env.reset(0)
    assert env.step("\\boxed{2}")[1] == 1.0


@pytest.mark.parametrize(
    "rows, config, words",
    [
        (
            None,
            {"data_path": "/nonexistent/math.jsonl"},
            ["env_config.data_path", "no such file"],
        ),
        (
            [{"q": "x", "answer": "1"}],
            {},
            ["env_config.question_key='problem'", "columns: q, answer"],
        ),
        (
            [{"problem": "x", "a": "1"}],
            {},
            ["env_config.answer_key='answer'", "set answer_key"],
        ),
        (
            [{"problem": "x", "answer": "1"}],
            {"split": "val"},
            ["env_config.split_key='split'"],
        ),
        (
            [{"problem": "x", "answer": "1", "split": "train"}],
            {"split": "val"},
            ["env_config.split='val'", "its splits: train"],
        ),
        ([{"problem": "x", "answer": None}], {}, ["row 0", "answer_key"]),
        ("not json\n", {}, ["line 1", "not valid JSON"]),
        ([{"problem": "x", "answer": "1"}], {"max_attempts": 0}, ["max_attempts=0"]),
    ],
)
def test_bad_dataset_is_a_one_line_config_error(tmp_path, rows, config, words):
    if rows is not None:
        path = tmp_path / "bad.jsonl"
        path.write_text(
            rows
            if isinstance(rows, str)
            else "".join(json.dumps(r) + "\n" for r in rows)
        )
        config = {"data_path": str(path), **config}
    with pytest.raises(ConfigError) as err:
        MathQAConfig(**config)  # building the config is enough: no env, no actor
    message = str(err.value)
    assert "\n" not in message and message.startswith("custom_envs.<Tag>.env_config.")
    for word in words:
        assert word in message


def test_unknown_file_type(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ConfigError, match="use .parquet or .jsonl"):
        make_env("math", {"data_path": str(path)})


def test_unknown_key_names_the_accepted_ones():
    with pytest.raises(ValueError, match="data_path"):
        make_env("math", {"dataset": "x"})


def test_shipped_dataset_is_the_generated_one_and_small():
    rows = [json.loads(line) for line in SHIPPED_TASKS.read_text().splitlines()]
    assert rows == generate_math_tasks(SHIPPED_NUM, SHIPPED_SEED)
    assert SHIPPED_TASKS.stat().st_size < 100_000
    assert len({r["problem"] for r in rows}) == len(rows) >= 300
    assert {r["split"] for r in rows} == {"train", "val"}


def test_generated_answers_verify_against_themselves_and_equivalent_forms():
    rows = generate_math_tasks(SHIPPED_NUM, SHIPPED_SEED)
    for row in rows:
        assert verify_answer(row["answer"], row["answer"]).correct, row
    fractions = [r for r in rows if "\\frac" in r["answer"]][:10]
    for row in fractions:
        sign = -1 if row["answer"].startswith("-") else 1
        num, den = row["answer"].lstrip("-")[len("\\frac{") : -1].split("}{")
        plain = f"{sign * int(num)}/{den}"
        assert verify_answer(row["answer"], plain).correct, row


Q_SUM, Q_EXPAND = "What is 2 + 3?", "Expand $(x + 3)(x - 2)$."


@pytest.mark.parametrize(
    "answer, reference, question, final",
    [
        # 1: the question's own expression
        ("2 + 3", "5", Q_SUM, False),
        ("(x + 3)(x - 2)", "x^2 + x - 6", Q_EXPAND, False),
        ("\\sqrt{72}", "6\\sqrt{2}", "Simplify $\\sqrt{72}$.", False),
        ("5", "5", "What is 5 times 1?", True),
        # 2: a plain number's answer is a plain number, a fraction in lowest terms
        ("3+2", "5", Q_SUM, False),
        ("\\sqrt{25}", "5", "", False),
        ("10/2", "5", "", False),
        ("\\frac{2}{5}\\cdot 20", "8", "", False),
        ("\\frac{68}{10}", "\\frac{34}{5}", "", False),
        ("2/4", "\\frac{1}{2}", "", False),
        ("x = 5", "5", Q_SUM, True),
        ("5 \\text{ apples}", "5", Q_SUM, True),
        ("\\text{5}", "5", Q_SUM, True),
        ("\\$28", "28", "", True),
        ("\\frac{85}{3} \\text{ km/h}", "\\frac{85}{3}", "", True),
        ("19.2\\%", "\\frac{96}{5}", "", True),
        ("0.5", "\\frac{1}{2}", "", True),
        ("\\frac{-1}{4}", "-\\frac{1}{4}", "", True),
        ("-1/4", "-\\frac{1}{4}", "", True),
        ("12,000", "12000", "", True),
        ("5.0", "5", "", True),
        # 3: no more operations than the reference; roots of numbers simplified
        ("(x - 2)(x + 3)", "x^2 + x - 6", Q_EXPAND, False),
        ("x^2 + 3x - 2x - 6", "x^2 + x - 6", "", False),
        ("x^2 + 2 \\cdot 5x + 9", "x^2 + 10x + 9", "", False),
        ("x^2 - 8^2", "x^2 - 64", "", False),
        ("\\sqrt{36}\\sqrt{2}", "6\\sqrt{2}", "", False),
        ("\\sqrt{36 \\cdot 2}", "6\\sqrt{2}", "", False),
        ("-6 + x + x^2", "x^2 + x - 6", Q_EXPAND, True),
        ("x^2 + 10 \\cdot x + 9", "x^2 + 10x + 9", "", True),
        ("6 \\cdot \\sqrt{2}", "6\\sqrt{2}", "Simplify $\\sqrt{72}$.", True),
    ],
)
def test_final_form(answer, reference, question, final):
    assert final_form(answer, reference, question) is final


def test_every_shipped_reference_boxed_scores_one():
    env = make_env("math", {})
    for seed in range(env.num_tasks):
        env.reset(seed)
        _, reward, _, _, info = env.step(f"\\boxed{{{env.task.answer}}}")
        assert reward == 1.0 and info["metrics"]["success"], (env.task, info)


def test_the_question_reaches_the_grader(tmp_path):
    # Only rule 1 (the question's own expression) rejects 3 + 2x: the env must hand over the question.
    question, reference = "Write $3 + 2x$ with the x term first.", "2x + 3"
    assert verify_answer(reference, "3 + 2x").correct
    assert verify_answer(reference, "3 + 2x", question=question).status is (
        VerifyStatus.NOT_FINAL
    )
    path = task_file(tmp_path, [{"problem": question, "answer": reference}])
    env = make_env("math", {"data_path": path, "max_attempts": 2})
    env.reset(0)
    obs, reward, _, _, info = env.step("\\boxed{3 + 2x}")
    assert reward == 0.0 and info["metrics"]["answer_not_final"]
    assert "not in final form" in obs
    _, reward, _, _, info = env.step("\\boxed{2x + 3}")
    assert reward == 1.0 and not info["metrics"]["answer_not_final"]


def test_latex_writers():
    assert latex_number(Fraction(9, 2)) == "\\frac{9}{2}"
    assert latex_number(Fraction(-3, 4)) == "-\\frac{3}{4}"
    assert latex_number(Fraction(8, 2)) == "4"
    assert latex_polynomial([1, 1, -6]) == "x^2 + x - 6"
    assert latex_polynomial([1, 0, -9]) == "x^2 - 9"
    assert latex_polynomial([1, -1, 0]) == "x^2 - x"


def test_make_env_dataset_rows_are_distinct_problems_of_the_split():
    rows = make_env_dataset_rows("math", 16, seed=0, split="val")
    assert all(r.env_config == {"split": "val"} for r in rows)
    problems = {r.make_env().reset(r.seed)[0] for r in rows}
    assert len(problems) == 16
    val = {
        f"Problem: {t['problem']}"
        for t in generate_math_tasks(SHIPPED_NUM, SHIPPED_SEED)
        if t["split"] == "val"
    }
    assert problems <= val


def test_config_defaults():
    config = MathQAConfig(max_attempts=3)
    assert config.max_steps == 3 and MathQAConfig().max_steps == 1
    assert isinstance(make_env("math", {}), MathQAEnv)
