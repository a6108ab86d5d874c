"""Test aids for games with seats: a scripted player that fails once, a game that never ends, one that lists no moves, and a fake engine's reply that plays a legal move.

The player is named by module path in a config (``scripted:roll_async.testing.game_players:fails_once``),
so it lives in the package, where env-manager workers can import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.errors import LifecycleError, RollAsyncError
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trajectory import GenerationRequest

#: Calls of :func:`fails_once` left before it fails (tests set it; 0: it never fails).
FAIL_AFTER = {"calls": 0}

_LEGAL = re.compile(r"Legal (?:moves|actions): ([^\n.]+)\.")


class ScriptedPlayerFailure(RollAsyncError, RuntimeError):
    """The failure :func:`fails_once` raises."""


def fails_once(observation_text: str, legal_actions: Sequence[str]) -> str:
    """Plays the first legal action; raises once, on the call ``FAIL_AFTER["calls"]`` counts down to."""
    if FAIL_AFTER["calls"] > 0:
        FAIL_AFTER["calls"] -= 1
        if FAIL_AFTER["calls"] == 0:
            raise ScriptedPlayerFailure("scripted player failed on purpose")
    return legal_actions[0]


def legal_move_reply(
    tokenizer: ChatTokenizer, pick: int = 0
) -> Callable[[GenerationRequest], list[int]]:
    """A FakeEngine ``output_fn`` that answers ``<answer>move</answer>`` + EOS with a legal move of the prompt's last list.

    ``pick`` chooses among the listed moves (modulo their number); a prompt without a list gets ``pass``.
    """

    def reply(request: GenerationRequest) -> list[int]:
        text = tokenizer.decode(request.prompt_token_ids)
        found = _LEGAL.findall(text)
        moves = [m.strip() for m in found[-1].split(",")] if found else ["pass"]
        answer = f"<answer>{moves[pick % len(moves)]}</answer>"
        ids: list[int] = tokenizer(answer, add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        return ids if eos is None else ids + [eos]

    return reply


class EndlessGame:
    """Two seats taking turns forever: every reply is accepted and the game never ends (a stuck game)."""

    num_players: int = 2

    def __init__(self) -> None:
        self.turn = 0

    def instruction(self, seat: int) -> str:
        return f"You are Player {seat}; the game never ends."

    def reset(self, seed: int) -> None:
        self.turn = 0

    def get_observation(self) -> SeatObservation:
        return SeatObservation(self.turn, "Legal moves: go.", ("go",))

    def step(self, action_text: str) -> TurnResult:
        seat, self.turn = self.turn, 1 - self.turn
        return TurnResult(seat, done=False)

    def close(self) -> GameOutcome:
        raise LifecycleError("EndlessGame never ends; close() has no outcome")

    def format_action(self, action: str) -> str:
        return f"<answer>{action}</answer>"


class NoListGame(EndlessGame):
    """A game whose moves are free-form: it lists no legal actions (a random seat cannot play it)."""

    def get_observation(self) -> SeatObservation:
        return SeatObservation(self.turn, "Say anything.")
