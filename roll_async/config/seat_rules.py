"""The rules of ``custom_envs.<Tag>.seats``: who plays each seat of a multi-player game, read and checked at load.

A tag that names a game lists one entry per seat, in seat order. Only what the text
alone can tell is checked here (the config layer imports no env code): each entry's
kind, that some seat is trained, that the tag's other keys can host a game. How many
seats the game has and whether a scripted player imports are checked by preflight
(``roll_async.envs.multiplayer.seats``), still before any actor starts.

Entries:

* ``policy``: the model being trained plays the seat; every policy seat gives one
  trajectory per game (self-play when there are several).
* ``random`` / ``heuristic`` (also ``scripted:random`` / ``scripted:heuristic``): the
  built-in scripted players (``roll_async.envs.multiplayer.players``).
* ``scripted:package.module:function``: a player ``(observation_text, legal_actions) -> action``.
* ``frozen:<model path>``: another model, served by its own engine (one per distinct path,
  launched by the pipeline, never weight-synced); it keeps its own conversation like a
  policy seat, but its tokens are never trained on. It must share the policy's chat-template
  settings (``model.chat_template``); its tokenizer is its own.
* ``pool``: a snapshot seat whose ``k`` is drawn per episode, uniformly from 1 to
  ``custom_envs.<Tag>.pool.last_k`` (an opponent pool of the last K policies); with
  ``pool.include_current`` from 0, where ``k`` 0 is the current policy, playing untrained.
* ``snapshot:<k>``: the policy as it was ``k`` weight syncs ago. In a run that syncs LoRA
  adapters (``trainer.lora.rank > 0``, ``sync: adapter``) the policy's own engines serve it as
  that version's adapter (they then keep ``k + 1`` versions loaded); in a full-weight run it gets
  an engine of its own per distinct ``k`` (``pipelines/snapshot_engines.py``), loaded after each
  sync with the weights of ``k`` syncs before. Until ``k`` syncs have happened it plays the oldest
  version there is (the run's start weights). Never trained on. A ``k`` the run never reaches
  (``k >= max_steps / weight_sync.interval``) is refused at load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from roll_async.errors import ConfigError

#: policy: the trained model; scripted: a player function (built-in or user code); frozen: another model
#: on its own engine, never weight-synced; snapshot: the policy k weight versions back (a LoRA adapter of
#: the policy's engines, or an engine of its own in a full-weight run).
SeatKind = Literal["policy", "scripted", "frozen", "snapshot"]
#: The built-in scripted players a seat may name without a module path.
BUILTIN_PLAYERS = ("random", "heuristic")
#: A snapshot seat whose k is drawn per episode from ``custom_envs.<Tag>.pool.last_k``.
POOL = "pool"


@dataclass(frozen=True)
class SeatSpec:
    """One seat of a game tag as configured.

    Attributes:
        seat: The seat's index (0-based, the game's seat order).
        kind: ``policy`` (trained), ``scripted``, ``frozen`` or ``snapshot``.
        player: For ``scripted``: ``random``, ``heuristic`` or ``package.module:function``; for ``frozen``:
            the model's path (as ``model.path`` takes it); for ``snapshot``: k, the versions back; "" for
            ``policy``.
    """

    seat: int
    kind: SeatKind
    player: str = ""

    @property
    def role(self) -> str:
        """The role name a trained seat's trajectories carry (``seat0``, ``seat1``, ...)."""
        return f"seat{self.seat}"

    @property
    def opponent_kind(self) -> str:
        """How this seat is described as someone's opponent: ``policy``, ``frozen``, ``random``, ``heuristic`` or ``scripted``."""
        if self.kind == "snapshot" and self.player == POOL:
            return POOL
        if self.kind in ("policy", "frozen", "snapshot"):
            return self.kind
        return self.player if self.player in BUILTIN_PLAYERS else "scripted"


def seat_key(tag: str, seat: int) -> str:
    return f"custom_envs.{tag}.seats[{seat}]"


def parse_seat(tag: str, seat: int, entry: object) -> SeatSpec:
    """One ``seats`` entry read; ConfigError naming ``custom_envs.<tag>.seats[<seat>]`` when it is not one."""
    key = seat_key(tag, seat)
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError(
            f"{key}={entry!r}: write policy, random, heuristic or scripted:package.module:function"
        )
    text = entry.strip()
    if text == "policy":
        return SeatSpec(seat, "policy")
    if text in BUILTIN_PLAYERS:
        return SeatSpec(seat, "scripted", text)
    if text == POOL:
        return SeatSpec(seat, "snapshot", POOL)
    kind, _, rest = text.partition(":")
    if kind == "scripted":
        if rest in BUILTIN_PLAYERS or (
            ":" in rest and all(part for part in rest.split(":", 1))
        ):
            return SeatSpec(seat, "scripted", rest)
        raise ConfigError(
            f"{key}={entry!r}: a scripted seat names random, heuristic or a player function "
            "'scripted:package.module:function'"
        )
    if kind == "frozen":
        if not rest.strip():
            raise ConfigError(
                f"{key}={entry!r}: a frozen seat names its model, 'frozen:<model path>' (as model.path takes it)"
            )
        return SeatSpec(seat, "frozen", rest.strip())
    if kind == "snapshot":
        if not rest.strip().isdigit() or int(rest) < 1:
            raise ConfigError(
                f"{key}={entry!r}: a snapshot seat names how many weight versions back it plays, "
                "'snapshot:<k>' with k >= 1"
            )
        return SeatSpec(seat, "snapshot", str(int(rest)))
    raise ConfigError(
        f"{key}={entry!r} is not a seat; write policy, random, heuristic, scripted:package.module:function, "
        "frozen:<model path> or snapshot:<k>"
    )


def parse_seats(tag: str, seats: object) -> list[SeatSpec]:
    """A tag's ``seats`` read in seat order; [] for a single-agent tag (no ``seats``)."""
    if seats is None:
        return []
    if not isinstance(seats, (list, tuple)):
        raise ConfigError(
            f"custom_envs.{tag}.seats={seats!r}: give a list, one entry per seat of the game, e.g. [policy, random]"
        )
    return [parse_seat(tag, i, entry) for i, entry in enumerate(seats)]


def trained_seats(tag: str, seats: object) -> int:
    """Trajectories one episode of the tag gives: its policy seats for a game, 1 for a single-agent env."""
    specs = parse_seats(tag, seats)
    return sum(s.kind == "policy" for s in specs) if specs else 1


def validate_seats(
    tag: str,
    seats: object,
    *,
    agent: str | None,
    service_url: object,
    isolation: str,
    has_reward: bool,
) -> None:
    """The checks of one tag's ``seats`` that need no env code (see the module docstring)."""
    specs = parse_seats(tag, seats)
    if not specs:
        return
    key = f"custom_envs.{tag}.seats"
    if len(specs) < 2:
        raise ConfigError(
            f"{key} lists {len(specs)} seat; a game has at least two: one entry per seat, e.g. [policy, random]"
        )
    if not any(s.kind == "policy" for s in specs):
        raise ConfigError(
            f"{key}={list(seats) if isinstance(seats, (list, tuple)) else seats!r} has no policy seat, so its "
            "games train nothing; make at least one seat policy"
        )
    if agent:
        raise ConfigError(
            f"{key}: an agent session (custom_envs.{tag}.agent) plays no game; remove seats or agent"
        )
    if service_url:
        raise ConfigError(
            f"{key}: games run in the worker (custom_envs.{tag}.service_url is set); remove service_url"
        )
    if isolation == "process":
        raise ConfigError(
            f"{key}: games run in the worker's threads; set custom_envs.{tag}.isolation to none or inline"
        )
    if has_reward:
        raise ConfigError(
            f"{key}: a game's rewards come from its outcome; remove custom_envs.{tag}.reward"
        )


def frozen_models(custom_envs: Mapping[str, Any], tags: Iterable[str]) -> list[str]:
    """The distinct ``frozen:`` model paths of the given tags' seats, in first-seen order (one engine each)."""
    models: list[str] = []
    for tag in tags:
        for seat in parse_seats(tag, getattr(custom_envs[tag], "seats", None)):
            if seat.kind == "frozen" and seat.player not in models:
                models.append(seat.player)
    return models


def snapshot_lag(seat: SeatSpec, pool_last_k: int) -> int:
    """The largest ``k`` a snapshot seat plays: its own, or the pool's ``last_k``."""
    return pool_last_k if seat.player == POOL else int(seat.player)


def snapshot_lags(seat: SeatSpec, first_k: int, last_k: int) -> list[int]:
    """Every ``k`` a snapshot seat may play: its own, or the pool's ``first_k``..``last_k``; [] for another seat."""
    if seat.kind != "snapshot":
        return []
    return (
        list(range(first_k, last_k + 1)) if seat.player == POOL else [int(seat.player)]
    )


def snapshot_engine_lags(
    custom_envs: Mapping[str, Any], tags: Iterable[str]
) -> list[int]:
    """The distinct ``k >= 1`` the tags' snapshot and pool seats play, ascending: a full-weight run's snapshot engines.

    ``k`` 0 (a pool with ``include_current``) is the current policy, served by the policy's own engines.
    """
    lags = {
        k
        for tag in tags
        for seat in parse_seats(tag, getattr(custom_envs[tag], "seats", None))
        for k in snapshot_lags(
            seat, custom_envs[tag].pool.first_k(), custom_envs[tag].pool.last_k
        )
        if k >= 1
    }
    return sorted(lags)


def max_snapshot_lag(custom_envs: Mapping[str, Any], tags: Iterable[str]) -> int:
    """The largest ``k`` of the tags' snapshot and pool seats (0 if none): the engines keep k + 1 adapters."""
    return max(snapshot_engine_lags(custom_envs, tags), default=0)


def check_snapshots(
    tag: str,
    seats: object,
    *,
    pool_last_k: int,
    versions_in_run: int,
) -> None:
    """Snapshot and pool seats need a ``k`` the run reaches (and a pool its ``last_k``); ConfigError naming the seat.

    Any run serves them: as LoRA adapters of the policy's engines, or on engines of their own in a full-weight run.
    """
    specs = parse_seats(tag, seats)
    pooled = [s for s in specs if s.player == POOL]
    if pool_last_k and not pooled:
        raise ConfigError(
            f"custom_envs.{tag}.pool.last_k={pool_last_k} but no seat plays from the pool; "
            f"add a 'pool' seat to custom_envs.{tag}.seats or remove the pool"
        )
    for seat in specs:
        if seat.kind != "snapshot":
            continue
        if seat.player == POOL:
            key = f"{seat_key(tag, seat.seat)}='pool'"
            if pool_last_k < 1:
                raise ConfigError(
                    f"{key}: a pool seat draws from the last K policy versions; set "
                    f"custom_envs.{tag}.pool.last_k (>= 1)"
                )
        else:
            key = f"{seat_key(tag, seat.seat)}='snapshot:{seat.player}'"
        k = snapshot_lag(seat, pool_last_k)
        if k >= versions_in_run:
            raise ConfigError(
                f"{key}: this run makes {versions_in_run} policy versions (max_steps / weight_sync.interval), "
                f"so the version {k} back never exists; use k below {versions_in_run}"
            )
