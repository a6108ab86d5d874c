"""Kuhn poker for two seats: a hidden-information game written here, so seat play is tested offline.

One hand. The deck is Jack < Queen < King; each seat antes 1 chip and is dealt one card,
seen only by its holder (the seed decides the deal). Seat 0 acts first. With no bet on
the table a seat may ``check`` or ``bet`` (1 chip); facing a bet it may ``call`` (1 chip)
or ``fold``. Check-check goes to showdown for the antes (+1 / -1); a called bet goes to
showdown for 2 (+2 / -2); a fold gives the pot to the bettor (the folder loses its ante,
-1 / +1). Zero-sum. Moves are written in the configured tag, ``<answer>bet</answer>`` by
default. An invalid move (no tag, not a legal action now) is told to its seat, which moves
again up to ``error_allowance`` times in that turn; one more is a fold.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from roll_async.envs.base import build_config
from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.envs.multiplayer.referee import GameConfig, Referee

CARDS = ("Jack", "Queen", "King")
_CARD = re.compile(r"Your card: (Jack|Queen|King)")


def parse_card(text: str) -> str:
    """The seat's own card named in an observation ('' when there is none)."""
    found = _CARD.findall(text)
    return found[-1] if found else ""


class KuhnPoker:
    """Two seats, one hand of Kuhn poker; see the module docstring for the rules."""

    num_players: int = 2
    config_cls = GameConfig

    def __init__(self, config: GameConfig | Mapping[str, Any] | None = None) -> None:
        self.config: GameConfig = build_config(GameConfig, config, "kuhn_poker")
        self.referee = Referee("kuhn_poker", self.num_players, self.config)
        self.seed: int | None = None
        self.cards: tuple[int, int] = (0, 1)
        self.put_in = [1, 1]
        self.history: list[str] = []
        self.turn = 0

    def instruction(self, seat: int) -> str:
        example = self.referee.wrap("check")
        return (
            f"You are Player {seat} in one hand of Kuhn poker against one opponent. The deck has three cards, "
            "Jack < Queen < King; each player antes 1 chip and gets one card, which the other cannot see. "
            "Player 0 acts first. With no bet on the table you may check or bet 1 chip; facing a bet you may "
            "call (1 chip) or fold. After check-check or a called bet the higher card wins the pot; a fold "
            "gives the pot to the bettor. Your reward is the chips you win (positive) or lose (negative). "
            f"An invalid move is told to you and you move again (at most {self.config.error_allowance} times "
            f"per turn); one more counts as a fold. Reply with one action inside the tags, for example {example}."
        )

    def reset(self, seed: int) -> None:
        """Deal from the seed: the same seed deals the same two cards."""
        self.seed = int(seed)
        first, second = random.Random(self.seed).sample(range(len(CARDS)), 2)
        self.cards = (first, second)
        self.put_in = [1, 1]
        self.history = []
        self.turn = 0
        self.referee.start()

    def legal_actions(self) -> tuple[str, ...]:
        return ("call", "fold") if "bet" in self.history else ("check", "bet")

    def get_observation(self) -> SeatObservation:
        self.referee.check_playing("get_observation")
        seat = self.turn
        legal = self.legal_actions()
        lines = self.referee.take_news(seat) + [
            f"You are Player {seat}. Your card: {CARDS[self.cards[seat]]}. Pot: {sum(self.put_in)} chips "
            f"(you put in {self.put_in[seat]}).",
            f"Legal actions: {', '.join(legal)}.",
        ]
        return SeatObservation(seat, "\n".join(lines), legal)

    def step(self, action_text: str) -> TurnResult:
        self.referee.check_playing("step")
        seat = self.turn
        ruling = self.referee.judge(seat, action_text, self.legal_actions())
        if ruling.action is None:
            if ruling.forfeit:
                self._fold(
                    seat,
                    f"Player {seat} made too many invalid moves, which counts as a fold. ",
                )
            return self.referee.invalid_turn(seat, ruling)
        action = ruling.action
        self.history.append(action)
        if action == "fold":
            self._fold(seat, "")
        elif action == "call":
            self.put_in[seat] += 1
            self._showdown()
        elif self.history == ["check", "check"]:
            self._showdown()
        else:
            self.put_in[seat] += 1 if action == "bet" else 0
            word = "bets 1 chip" if action == "bet" else "checks"
            self.referee.tell(f"Player {seat} {word}.", 1 - seat)
            self.turn = 1 - seat
        return TurnResult(seat, self.referee.done)

    def close(self) -> GameOutcome:
        return self.referee.outcome()

    def format_action(self, action: str) -> str:
        return self.referee.wrap(action)

    def _fold(self, seat: int, why: str) -> None:
        lost = float(self.put_in[seat])
        other = 1 - seat
        self.referee.finish(
            [-lost if s == seat else lost for s in range(2)],
            f"{why}Player {seat} folds; Player {other} wins the pot of {sum(self.put_in)} without a showdown.",
        )

    def _showdown(self) -> None:
        win = 0 if self.cards[0] > self.cards[1] else 1
        lose = 1 - win
        stake = float(self.put_in[lose])
        self.referee.finish(
            [stake if s == win else -stake for s in range(2)],
            f"Showdown: Player {win}'s {CARDS[self.cards[win]]} beats Player {lose}'s "
            f"{CARDS[self.cards[lose]]}; Player {win} wins {stake:g}.",
        )
