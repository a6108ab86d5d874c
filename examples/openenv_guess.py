"""An OpenEnv environment written the OpenEnv way (typed Action, Observation, State), trained through ``openenv:``.

``configs/openenv_guess.yaml`` names the class (``env_type: openenv:examples.openenv_guess:GuessEnvironment``),
so each rollout worker serves it on a loopback server and plays it over OpenEnv's WebSocket
client; the same class served elsewhere (``uvicorn`` on ``create_app(GuessEnvironment, GuessAction,
GuessObservation)``) is played with ``env_type: openenv:http://host:port``. The reply's
``<answer>N</answer>`` becomes ``GuessAction(guess=N)`` (``action_pattern`` in the config).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    message: str


class GuessEnvironment(Environment):  # type: ignore[misc]
    """Guess a number from 1 to ``high`` in a few turns; reward 1 for the right number, hints otherwise."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 4) -> None:
        super().__init__()
        self.high = int(high)
        self._target = 1
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._target = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return GuessObservation(message=f"I picked a number from 1 to {self.high}.")

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self._target:
            return GuessObservation(message="Correct!", reward=1.0, done=True)
        hint = "higher" if action.guess < self._target else "lower"
        return GuessObservation(message=f"No, {hint}.", reward=0.0, done=False)

    @property
    def state(self) -> State:
        return self._state
