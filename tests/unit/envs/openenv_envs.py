"""OpenEnv environments for the openenv adapter's tests (served by the real openenv-core on the loopback)."""

from __future__ import annotations

import json
import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State


class CountAction(Action):
    amount: int


class CountObservation(Observation):
    total: int
    note: str = ""


class CountEnvironment(Environment):
    """Adds ``amount`` to a total that starts at the seed; done at ``goal`` with reward 1, else reward 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, goal: int = 10) -> None:
        super().__init__()
        self.goal = goal
        self.total = 0
        self._state = State(step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> CountObservation:
        self.total = int(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return CountObservation(total=self.total, note="start")

    def step(
        self, action: CountAction, timeout_s: float | None = None, **kwargs: Any
    ) -> CountObservation:
        self._state.step_count += 1
        self.total += action.amount
        done = self.total >= self.goal
        return CountObservation(
            total=self.total, note="goal" if done else "", reward=float(done), done=done
        )

    @property
    def state(self) -> State:
        return self._state


class SoloCountEnvironment(CountEnvironment):
    """The same env without ``SUPPORTS_CONCURRENT_SESSIONS``: one session per server."""

    SUPPORTS_CONCURRENT_SESSIONS = False


class TextAction(Action):
    text: str
    loud: bool = False


class TextObservation(Observation):
    text: str


class FaultyEnvironment(Environment):
    """Raises in ``step`` on the server every ``fail_every``-th step of the process (a fault mid-episode)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    steps = 0

    def __init__(self, fail_every: int = 3, episode_length: int = 2) -> None:
        super().__init__()
        self.fail_every = fail_every
        self.episode_length = episode_length
        self.turn = 0
        self._state = State(step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> TextObservation:
        self.turn = 0
        return TextObservation(text=f"seed {seed}: say anything")

    def step(
        self, action: TextAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TextObservation:
        FaultyEnvironment.steps += 1
        if FaultyEnvironment.steps % self.fail_every == 0:
            raise RuntimeError("the env's backend fell over")
        self.turn += 1
        done = self.turn >= self.episode_length
        return TextObservation(text=f"turn {self.turn}", reward=1.0, done=done)

    @property
    def state(self) -> State:
        return self._state


def loud_text(reply: str) -> dict[str, Any]:
    """An ``action_builder``: the reply as JSON ``{"text": ..., "loud": ...}``; other text is a format error."""
    try:
        fields = json.loads(reply)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply is not JSON ({exc.msg})") from None
    return dict(fields)


def random_amount(reply: str) -> CountAction:
    """An ``action_builder`` that returns the Action itself."""
    return CountAction(amount=random.Random(reply).randint(1, 3))
