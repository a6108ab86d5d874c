"""What an EnvManager takes from an env besides observations: the env's own timeline spans, and the
policy's tokenizer it hands to an in-thread env that asks for one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from roll_async.config.rollout_spec import rollout_spec
from roll_async.env_managers.trajectory_bookkeeping import note_env_spans
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import EnvSpan, Trajectory
from tests.unit.env_managers.test_env_manager import make_config


class SpanEnv:
    """Two turns; reset reports one span, each step two (one malformed, left out), and it records its tokenizer."""

    def __init__(self) -> None:
        self.tokenizer: Any = None
        self.turn = 0

    def use_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.turn = 0
        began = time.time()
        return "start", {
            "instruction": "go",
            "env_spans": [
                {"name": "boot", "started_at": began, "finished_at": time.time()}
            ],
        }

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        began = time.time()
        spans = [
            {"name": "work", "started_at": began, "finished_at": time.time()},
            {"name": "backwards", "started_at": began + 1.0, "finished_at": began},
        ]
        metrics = {"has_tokenizer": float(self.tokenizer is not None)}
        return (
            "ok",
            1.0,
            self.turn == 2,
            False,
            {"env_spans": spans, "metrics": metrics},
        )


async def test_env_spans_reach_the_trajectory_in_order_and_the_env_gets_the_tokenizer() -> (
    None
):
    tokenizer = build_chatml_test_tokenizer()
    reply = tokenizer.encode("<answer>Up</answer>", add_special_tokens=False)
    scheduler = LocalRolloutScheduler(
        rollout_spec(make_config(), "train"),
        engines=FakeEngine(lambda r: reply + [tokenizer.eos_token_id]),
        tokenizer=tokenizer,
        env_factory=lambda tag, env_config: SpanEnv(),
    )
    try:
        (trajectory,) = await asyncio.wait_for(scheduler.get_batch(step=0), 5)
    finally:
        await scheduler.shutdown()
    assert [(s.name, s.turn) for s in trajectory.env_spans] == [
        ("boot", -1),
        ("work", 0),
        ("work", 1),
    ]
    assert all(s.started_at <= s.finished_at for s in trajectory.env_spans)
    assert trajectory.metrics["has_tokenizer"] == 1.0
    record = trajectory.to_record()
    assert [s["name"] for s in record["env_spans"]] == ["boot", "work", "work"]


def test_malformed_env_spans_are_left_out() -> None:
    trajectory = Trajectory("t", 0, 0, 0, 0, "t-0", 0)
    note_env_spans(trajectory, None, 0)
    note_env_spans(trajectory, {"env_spans": "not a list"}, 0)
    note_env_spans(
        trajectory,
        {
            "env_spans": [
                "x",
                {"name": "", "started_at": 1.0, "finished_at": 2.0},
                {"name": "a", "started_at": True, "finished_at": 2.0},
                {"name": "b", "started_at": "1", "finished_at": 2.0},
                {"name": "c", "started_at": 1, "finished_at": 2.5},
            ]
        },
        3,
    )
    assert trajectory.env_spans == [EnvSpan("c", 1.0, 2.5, 3)]
