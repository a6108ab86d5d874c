"""``textarena:<GameId>`` with seats: a multi-player TextArena game behind the seat contract.

TextArena's own interface is already seat-shaped (``get_observation() -> (player_id,
messages)``, ``step(action) -> (done, info)``, ``close() -> (rewards, info)``), so this
adapter only turns its message tuples into each seat's text, counts invalid moves per
seat and checks the outcome. Games that reach the network are refused as for the
single-player adapter.
"""

from __future__ import annotations

import math
import re
from typing import Any

from roll_async.envs.adapters.textarena_env import load_textarena_game
from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.errors import ConfigError, LifecycleError

#: A bracketed move in a game's "available moves/actions" line: ``'[4]'``, ``'[check]'``.
_BRACKETED = re.compile(r"\[([^\[\]]+)\]")


class TextArenaGame:
    """A TextArena game for ``num_players`` seats (``textarena.make(game_id, **env_config)``).

    * Instructions: each seat's ``PROMPT`` message (the rules and its role) is
      ``instruction(seat)``; it is not repeated in observations.
    * Observations: the messages TextArena addressed to the seat to move since its last
      turn, one per line. Other seats' raw replies (``PLAYER_ACTION``) are dropped unless
      ``share_replies: true``: a reply may carry reasoning that gives away what only its
      seat knows, and board games describe every move in their own words anyway;
      conversational games (negotiation, debate), where the reply is the move, need it on.
    * Legal actions: read from the last line of the observation that lists "available"
      moves or actions in brackets (TicTacToe, KuhnPoker, ... write one); empty otherwise.
    * Actions: the reply goes to ``step`` whole; ``format_action`` writes ``[move]``,
      TextArena's usual syntax.
    * Invalid moves: TextArena's own rule (a retry, then the invalid mover loses, in its
      two-player games); every call of ``state.set_invalid_move`` is counted for the seat
      to move.
    * Rewards: ``close()`` settles TextArena's per-player rewards. They must sum to 0
      unless ``zero_sum: false`` says the game is not zero-sum.
    * Seeds: TextArena seeds Python's global ``random`` in ``reset``, so one seed deals the
      same game as long as nothing else in the process draws from ``random`` meanwhile.
    """

    num_players: int = 2

    def __init__(
        self,
        env_id: str,
        *,
        num_players: int = 2,
        allow_network: bool = False,
        zero_sum: bool = True,
        share_replies: bool = False,
        **make_kwargs: Any,
    ) -> None:
        if int(num_players) < 1:
            raise ConfigError(
                f"env_config.num_players={num_players} for textarena:{env_id}: give the game's number of players (>= 1)"
            )
        ta, self.game = load_textarena_game(env_id, allow_network, make_kwargs)
        self.env_id = env_id
        self.num_players = int(num_players)
        self.zero_sum = bool(zero_sum)
        self.share_replies = bool(share_replies)
        self._prompt_type = ta.ObservationType.PROMPT
        self._action_type = ta.ObservationType.PLAYER_ACTION
        self._instructions: list[str] = [""] * self.num_players
        self.invalid_moves = [0] * self.num_players
        self._invalid: tuple[bool, str] = (False, "")
        self._seen: SeatObservation | None = None
        self._done = True
        self._started = False

    def instruction(self, seat: int) -> str:
        return self._instructions[seat]

    def reset(self, seed: int) -> None:
        try:
            self.game.reset(num_players=self.num_players, seed=int(seed))
        except AssertionError as exc:
            raise ConfigError(
                f"textarena:{self.env_id} does not take env_config.num_players={self.num_players} ({exc}); "
                "set num_players to a count the game accepts"
            ) from None
        self._count_invalid_moves()
        self.invalid_moves = [0] * self.num_players
        self._instructions = [
            "\n".join(
                str(message).strip()
                for _, message, kind in self.game.state.observations.get(seat, [])
                if kind == self._prompt_type
            )
            for seat in range(self.num_players)
        ]
        self._seen = None
        self._done = False
        self._started = True

    def get_observation(self) -> SeatObservation:
        self._check_playing("get_observation")
        if (
            self._seen is None
        ):  # TextArena hands each message out once: keep it until the move
            seat, messages = self.game.get_observation()
            lines = [
                str(message).strip()
                for sender, message, kind in messages or []
                if kind != self._prompt_type
                and (
                    kind != self._action_type or (self.share_replies and sender != seat)
                )
            ]
            text = "\n".join(line for line in lines if line)
            self._seen = SeatObservation(int(seat), text, _listed_moves(text))
        return self._seen

    def step(self, action_text: str) -> TurnResult:
        self._check_playing("step")
        seat = int(self.game.state.current_player_id)
        self._invalid = (False, "")
        self._seen = None
        done, _ = self.game.step(action_text)
        self._done = bool(done)
        invalid, reason = self._invalid
        return TurnResult(seat, self._done, invalid=invalid, reason=reason)

    def close(self) -> GameOutcome:
        if not self._started or not self._done:
            raise LifecycleError(
                f"textarena:{self.env_id}: close() before the game ended; step until TurnResult.done"
            )
        rewards, game_info = self.game.close()
        by_seat = rewards or {}
        values = tuple(float(by_seat.get(s, 0.0)) for s in range(self.num_players))
        if self.zero_sum and not math.isclose(sum(values), 0.0, abs_tol=1e-9):
            raise ConfigError(
                f"textarena:{self.env_id} gave rewards {list(values)}, which do not sum to 0; set "
                "env_config.zero_sum: false if the game is not zero-sum"
            )
        reasons = [
            str(info.get("reason"))
            for info in (game_info or {}).values()
            if isinstance(info, dict) and info.get("reason")
        ]
        return GameOutcome(
            rewards=values,
            zero_sum=self.zero_sum,
            invalid_moves=tuple(self.invalid_moves),
            reason=reasons[0] if reasons else "",
        )

    def format_action(self, action: str) -> str:
        return f"[{action}]"

    # -- internals ----------------------------------------------------------------------

    def _check_playing(self, call: str) -> None:
        if not self._started:
            raise LifecycleError(f"textarena:{self.env_id}: {call}() before reset()")
        if self._done:
            raise LifecycleError(
                f"textarena:{self.env_id}: {call}() after the game ended; call close(), then reset()"
            )

    def _count_invalid_moves(self) -> None:
        """Wrap this game's ``state.set_invalid_move`` (a fresh state per reset) to count each seat's invalid moves."""
        state = self.game.state
        original = state.set_invalid_move

        def counted(*args: Any, **kwargs: Any) -> Any:
            seat = int(state.current_player_id)
            if 0 <= seat < self.num_players:
                self.invalid_moves[seat] += 1
            self._invalid = (True, str(kwargs.get("reason", args[0] if args else "")))
            return original(*args, **kwargs)

        state.set_invalid_move = counted


def _listed_moves(text: str) -> tuple[str, ...]:
    """The bracketed moves on the last line that lists "available" ones, else ()."""
    for line in reversed(text.splitlines()):
        if "available" in line.lower():
            moves = tuple(m.strip() for m in _BRACKETED.findall(line))
            if moves:
                return moves
    return ()
