"""The bookkeeping every built-in game shares: reading a seat's reply, the invalid-move rule, per-seat news, the lifecycle.

A game holds a :class:`Referee` (composition, not a base class) and keeps only its own
rules and state. The invalid-move rule is TextArena's: a seat whose reply does not parse
or names an illegal move is told why and moves again, up to ``error_allowance`` times in
one turn; one more invalid move forfeits the game. Every invalid move is counted per seat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roll_async.envs.multiplayer.base import GameOutcome, TurnResult
from roll_async.envs.parsing import ActionParser
from roll_async.errors import ConfigError, LifecycleError


@dataclass
class GameConfig:
    """Settings every built-in game accepts (a game's ``env_config``)."""

    #: Regex with one capture group around the action; the last match in a reply wins.
    action_pattern: str = r"<answer>(.*?)</answer>"
    #: Invalid moves a seat may retry within one turn; the next one forfeits the game.
    error_allowance: int = 1

    def __post_init__(self) -> None:
        if int(self.error_allowance) < 0:
            raise ConfigError(
                f"error_allowance must be >= 0, got {self.error_allowance}; 0 forfeits on the first invalid move"
            )
        self.error_allowance = int(self.error_allowance)


@dataclass(frozen=True)
class Ruling:
    """The referee's reading of one reply: the legal move, or why it is invalid and whether it forfeits."""

    action: str | None
    reason: str = ""
    forfeit: bool = False


class Referee:
    """Reads replies against the legal moves, counts invalid ones per seat, keeps each seat's news until its turn."""

    def __init__(
        self, name: str, num_players: int, config: GameConfig, zero_sum: bool = True
    ) -> None:
        self.name = name
        self.num_players = num_players
        self.config = config
        self.zero_sum = zero_sum
        self.parser = ActionParser(pattern=config.action_pattern, separator="")
        self.invalid_moves = [0] * num_players
        self.done = False
        self._started = False
        self._errors_this_turn = 0
        self._news: list[list[str]] = [[] for _ in range(num_players)]
        self._rewards: tuple[float, ...] = ()
        self._reason = ""

    def start(self) -> None:
        """A new game: counts, news and the outcome cleared."""
        self.invalid_moves = [0] * self.num_players
        self.done = False
        self._started = True
        self._errors_this_turn = 0
        self._news = [[] for _ in range(self.num_players)]
        self._rewards = ()
        self._reason = ""

    def check_playing(self, call: str) -> None:
        """LifecycleError when ``call`` comes before ``reset`` or after the game ended."""
        if not self._started:
            raise LifecycleError(f"{self.name}.{call}() called before reset()")
        if self.done:
            raise LifecycleError(
                f"{self.name}.{call}() called after the game ended; call close() for the outcome, then reset()"
            )

    def tell(self, text: str, seat: int | None = None) -> None:
        """Queue news for one seat, or for every seat when ``seat`` is None."""
        for s in range(self.num_players) if seat is None else (seat,):
            self._news[s].append(text)

    def take_news(self, seat: int) -> list[str]:
        """The seat's news since it last looked (cleared by the call)."""
        news, self._news[seat] = self._news[seat], []
        return news

    def judge(self, seat: int, reply: str, legal: Sequence[str]) -> Ruling:
        """The legal move ``reply`` names, or an invalid ruling (counted; told to the seat; a forfeit past the allowance)."""
        parsed = self.parser.parse(reply)
        word = parsed.actions[0].strip().lower() if parsed.actions else ""
        by_word = {a.lower(): a for a in legal}
        if parsed.is_valid and word in by_word:
            self._errors_this_turn = 0
            return Ruling(by_word[word])
        if not parsed.is_valid:
            reason = parsed.error or "no action"
        else:
            reason = f"{word!r} is not a legal move now; legal: {', '.join(legal)}"
        self.invalid_moves[seat] += 1
        self._errors_this_turn += 1
        if self._errors_this_turn > self.config.error_allowance:
            return Ruling(None, reason, forfeit=True)
        self.tell(
            f"Invalid move ({reason}). Reply again, for example {self.parser.wrap(legal[0])}.",
            seat,
        )
        return Ruling(None, reason)

    @staticmethod
    def invalid_turn(seat: int, ruling: Ruling) -> TurnResult:
        """The turn of a reply that named no legal move: the seat moves again, or the game is over if it forfeited."""
        return TurnResult(seat, ruling.forfeit, invalid=True, reason=ruling.reason)

    def win(self, seat: int, reason: str) -> None:
        """End a two-seat game that ``seat`` won: +1 to it, -1 to the other."""
        self.finish([1.0 if s == seat else -1.0 for s in range(2)], reason)

    def forfeit(self, seat: int) -> None:
        """End a two-seat game that ``seat`` forfeited by one invalid move too many: the other seat wins."""
        self.win(1 - seat, f"Player {seat} forfeits after too many invalid moves.")

    def finish(self, rewards: Sequence[float], reason: str) -> None:
        """End the game with these rewards (seat order) and the public reason."""
        self._rewards = tuple(float(r) for r in rewards)
        self._reason = reason
        self.done = True

    def outcome(self) -> GameOutcome:
        """The finished game's outcome (zero-sum checked); LifecycleError before the game ended."""
        if not self.done:
            raise LifecycleError(
                f"{self.name}.close() called before the game ended; step until TurnResult.done"
            )
        return GameOutcome(
            rewards=self._rewards,
            zero_sum=self.zero_sum,
            invalid_moves=tuple(self.invalid_moves),
            reason=self._reason,
        )

    def wrap(self, action: str) -> str:
        """``action`` written as a reply the parser reads (``<answer>4</answer>`` by default)."""
        return self.parser.wrap(action)
