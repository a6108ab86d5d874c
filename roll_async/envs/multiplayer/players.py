"""Scripted players for the built-in games: a seeded random player and one simple heuristic per game.

A player is a plain callable ``(observation_text, legal_actions) -> action``: it sees only
what its seat sees and answers with a bare action word (``"4"``, ``"bet"``), which the
game's ``format_action`` writes as a reply. So each one can sit in a seat as a baseline
opponent or a test partner without knowing anything the seat may not know.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from roll_async.envs.multiplayer.kuhn_poker import parse_card
from roll_async.envs.multiplayer.nim import parse_pile
from roll_async.envs.multiplayer.tic_tac_toe import LINES, MARKS, parse_board
from roll_async.errors import InvalidInputError

#: ``(observation_text, legal_actions) -> action``: a bare action word (or any text: an illegal one is the game's business).
Player = Callable[[str, Sequence[str]], str]

_CENTER = 4
_CORNERS = (0, 2, 6, 8)


def seat_seed(game_seed: int, seat: int) -> int:
    """The seed of a scripted seat's own generator in the game played with ``game_seed``."""
    return random.Random(game_seed * 1_000_003 + seat).getrandbits(32)


def random_player(seed: int) -> Player:
    """A player that picks uniformly among the legal actions, from its own seeded generator."""
    rng = random.Random(seed)

    def play(observation_text: str, legal_actions: Sequence[str]) -> str:
        if not legal_actions:
            raise InvalidInputError(
                "random_player got no legal actions: it plays only games that list them "
                "(SeatObservation.legal_actions); script a player for this game instead"
            )
        return rng.choice(list(legal_actions))

    return play


def tic_tac_toe_heuristic(observation_text: str, legal_actions: Sequence[str]) -> str:
    """Win if it can, else block the opponent's win, else keep it from a fork, else center, corner, side."""
    cells = parse_board(observation_text)
    legal = [int(a) for a in legal_actions if a.isdigit()]
    if not legal:
        return legal_actions[0] if legal_actions else ""
    me = MARKS[0] if cells.count(MARKS[0]) == cells.count(MARKS[1]) else MARKS[1]
    them = MARKS[1] if me == MARKS[0] else MARKS[0]
    for mark in (me, them):
        for cell in legal:
            if _completes(cells, cell, mark):
                return str(cell)
    forks = [cell for cell in legal if _threats_after(cells, cell, them) >= 2]
    if forks:
        return str(_answer_forks(cells, legal, forks, me))
    for choice in ([_CENTER], _CORNERS, range(9)):
        for cell in choice:
            if cell in legal:
                return str(cell)
    return str(legal[0])


def kuhn_poker_heuristic(observation_text: str, legal_actions: Sequence[str]) -> str:
    """Bet with a King or Queen and check a Jack; facing a bet, call with a King or Queen and fold a Jack."""
    strong = parse_card(observation_text) in ("King", "Queen")
    if "bet" in legal_actions:
        return "bet" if strong else "check"
    if "fold" in legal_actions and not strong:
        return "fold"
    return "call" if "call" in legal_actions else legal_actions[0]


def nim_heuristic(observation_text: str, legal_actions: Sequence[str]) -> str:
    """Take the whole pile when it can, else leave a multiple of (most stones a move takes + 1), else take 1."""
    pile = parse_pile(observation_text)
    takes = [int(a) for a in legal_actions if a.isdigit()]
    if not takes:
        return legal_actions[0] if legal_actions else ""
    if pile in takes:
        return str(pile)
    winning = pile % (max(takes) + 1)
    return str(winning if winning in takes else min(takes))


#: The heuristic player of each built-in game, by its registry name.
HEURISTICS: dict[str, Player] = {
    "tic_tac_toe": tic_tac_toe_heuristic,
    "kuhn_poker": kuhn_poker_heuristic,
    "nim": nim_heuristic,
}


def _answer_forks(cells: list[str], legal: list[int], forks: list[int], me: str) -> int:
    """The move against the opponent's fork cells: a threat whose forced block is no fork cell, else the only fork cell."""
    forcing = []
    for cell in legal:
        after = list(cells)
        after[cell] = me
        blocks = [c for c in legal if c != cell and _completes(after, c, me)]
        if blocks and not any(b in forks for b in blocks):
            forcing.append(cell)
    for cell in forcing:  # best: a threat that also takes a fork cell
        if cell in forks:
            return cell
    if len(forks) == 1:
        return forks[0]
    return forcing[0] if forcing else forks[0]


def _completes(cells: list[str], cell: int, mark: str) -> bool:
    """Marking ``cell`` with ``mark`` makes three in a row."""
    return any(
        cell in line and all(cells[c] == mark for c in line if c != cell)
        for line in LINES
    )


def _threats_after(cells: list[str], cell: int, mark: str) -> int:
    """Lines that would hold two of ``mark`` and one empty cell after marking ``cell``."""
    after = list(cells)
    after[cell] = mark
    return sum(
        1
        for line in LINES
        if cell in line
        and sum(after[c] == mark for c in line) == 2
        and sum(not after[c] for c in line) == 1
    )
