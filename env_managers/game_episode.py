"""One game with seats played as one episode: every policy seat keeps its own token-exact trajectory, the scripted seats answer in place.

A game tag (``custom_envs.<Tag>.seats``) is played by one EnvManager, move by move,
whichever seat is to move: a policy seat's turn is its own engine request over its
own conversation, built only from that seat's observations (a seat never sees what
only another seat may know), with the generated ids, behaviour logprobs and weight
versions kept as for any env episode; a scripted seat's move is a function call and
leaves no tokens; a ``frozen:`` seat plays like a policy seat on its own model's engine
(never weight-synced) and its conversation is dropped at the end; a ``snapshot:<k>`` or
``pool`` seat likewise, on the policy ``k`` syncs back: an adapter of the policy's engine
(LoRA runs) or the engine of that lag (full-weight runs). Games run side by
side in different EnvManagers, so no seat waits on another game. The finished game
gives one trajectory per policy seat, each with its own reward and role (``seat<i>``),
handed over together (``Trajectory.game_seats``) so the queue keeps, drops or re-plays
a game whole.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll_async.config.schema import CustomEnvConfig, GenerationConfig
from roll_async.config.seat_rules import (
    POOL,
    SeatSpec,
    parse_seats,
    snapshot_lag,
    snapshot_lags,
)
from roll_async.engine.router import EngineClient
from roll_async.env_managers.env_calls import EnvCaller
from roll_async.env_managers.env_status import PhaseReporter
from roll_async.env_managers.trajectory_bookkeeping import (
    append_tokens,
    episode_metrics,
    note_versions,
)
from roll_async.env_managers.turn_generator import TurnGenerator
from roll_async.envs.multiplayer.base import GameOutcome, SeatObservation, TurnResult
from roll_async.envs.multiplayer.players import Player, seat_seed
from roll_async.envs.multiplayer.seats import PlayerFactory, seat_player_factory
from roll_async.errors import EngineRequestError, EnvCallError, LifecycleError
from roll_async.prompts.images import ObservationEncoder
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trajectory import EpisodeSpec, Trajectory

#: Moves (invalid ones included) a game may take per seat and ``max_steps``: room for the invalid-move
#: retries; a game still running after that many ends ``max_steps`` with no rewards.
MOVES_PER_TURN = 4
#: Game metrics each policy seat's trajectory carries (1.0 or 0.0 for the outcome; rates per reply).
GAME_OUTCOMES = ("game_win", "game_draw", "game_loss")


class GameEpisodeSettings(Protocol):
    """The tag's settings a game reads (an EnvManagerSettings has them)."""

    tag: str
    custom_env: CustomEnvConfig
    sequence_length: int
    generation: GenerationConfig
    greedy: bool


@dataclass(frozen=True)
class FrozenSeat:
    """A ``frozen:`` seat's model: a client of its own engine (never weight-synced) and its prompt builder."""

    engine: EngineClient
    prompts: ChatPromptBuilder


@dataclass(frozen=True)
class OpponentModel:
    """A frozen model's engines as one process sees them: a client per env (a Router's) and its tokenizer."""

    client_for: Callable[[int], EngineClient]
    tokenizer: ChatTokenizer


@dataclass
class _SeatPlay:
    """One model seat's conversation in the game being played (a policy seat's, or a frozen one's)."""

    trajectory: Trajectory
    turns: TurnGenerator
    prompts: ChatPromptBuilder
    #: A policy seat: its trajectory is handed over and trained on. A frozen seat's is dropped.
    trained: bool = True
    moves: int = 0
    last_generated: list[int] = field(default_factory=list)
    #: Why the seat stopped moving before the game ended (its stop reason): ``max_length`` (out of
    #: sequence_length) or ``max_steps`` (its turns spent); it then replies "" (an invalid move).
    stopped: str = ""


class GameEpisodeRunner:
    """Plays the games of one EnvManager's game tag (see the module docstring).

    ``custom_env.max_steps`` bounds each policy seat's turns: a seat whose turns are spent
    replies "" (an invalid move), so a game with an invalid-move rule ends by its forfeit
    (its trajectory ends ``max_steps``). The game as a whole gets ``MOVES_PER_TURN x
    max_steps x seats`` moves (invalid ones included) and ends ``max_steps`` for every
    seat, with no rewards, if it has not finished by then. A game or scripted player that raises or
    overruns ``env_step_timeout_s``, or a frozen seat's engine that still fails after its
    retries, is an :class:`EnvCallError` (the caller ends the episode ``env_error``: counted,
    its seat re-opened); the policy's own engine failing ends the rollout, as for any env.

    ``snapshots`` (a full-weight run): lag k -> this env's client of the engine serving the policy
    k syncs back; a snapshot seat of lag k sends its requests there (lag 0, the current policy: the
    policy's engine), and a failing one is an ``env_error`` like a frozen seat's. Without them a
    snapshot seat plays on the policy's engine ``adapter_lag`` k back (LoRA runs; in a run that
    never syncs, such as the rollout-only pipeline, every version is the same).
    """

    def __init__(
        self,
        settings: GameEpisodeSettings,
        env_calls: EnvCaller,
        turns: TurnGenerator,
        prompts: ChatPromptBuilder,
        phases: PhaseReporter,
        frozen: Mapping[int, FrozenSeat] | None = None,
        snapshots: Mapping[int, EngineClient] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tag = settings.tag
        self.custom_env = settings.custom_env
        self.sequence_length = settings.sequence_length
        self.env_calls = env_calls
        self.turns = turns
        self.prompts = prompts
        self.phases = phases
        self._clock = clock
        self.seats: list[SeatSpec] = parse_seats(self.tag, self.custom_env.seats)
        self.players: dict[int, PlayerFactory] = {
            s.seat: seat_player_factory(self.tag, s, self.custom_env.env_type)
            for s in self.seats
            if s.kind == "scripted"
        }
        missing = [
            s.seat
            for s in self.seats
            if s.kind == "frozen" and s.seat not in (frozen or {})
        ]
        if missing:
            raise LifecycleError(
                f"custom_envs.{self.tag}.seats[{missing[0]}] is a frozen model, but this rollout has no engine "
                "for it (the pipeline launches one per frozen model; a caller building schedulers passes them)"
            )
        self.snapshots = dict(snapshots or {})
        pool = self.custom_env.pool
        unserved = sorted(
            {
                k
                for s in self.seats
                for k in snapshot_lags(s, pool.first_k(), pool.last_k)
                if k >= 1
            }
            - set(self.snapshots)
        )
        if self.snapshots and unserved:
            raise LifecycleError(
                f"custom_envs.{self.tag}.seats play the policy {unserved[0]} syncs back, but this rollout has no "
                "engine for it (a full-weight run's pipeline launches one per snapshot lag)"
            )
        self.pool_lags: dict[int, int] = {}
        #: The lag each snapshot seat plays this game (a pool seat's is drawn per game in ``run``).
        self.snapshot_lags: dict[int, int] = {}

        def opponent_turns(
            engine: Any, kind: str, seat: int, decode: Any
        ) -> TurnGenerator:
            """An untrained seat's own TurnGenerator: its engine and its request ids."""
            return TurnGenerator(
                turns.env_id,
                engine,
                generation=settings.generation,
                stop=list(self.custom_env.stop),
                observations=ObservationEncoder(None),
                stats=turns.stats,
                phases=phases,
                greedy=settings.greedy,
                request_prefix=f"{turns.request_prefix}{kind}{seat}-",
                decode=decode,
            )

        #: Untrained model seats, each with its own TurnGenerator and request ids: a frozen seat on its
        #: model's engine; a snapshot seat on the policy k versions back (see ``_aim_snapshot``).
        self.opponents: dict[int, tuple[TurnGenerator, ChatPromptBuilder]] = {
            seat: (
                opponent_turns(model.engine, "frozen", seat, model.prompts.decode),
                model.prompts,
            )
            for seat, model in (frozen or {}).items()
        }
        for s in self.seats:
            if s.kind == "snapshot":
                self.opponents[s.seat] = (
                    opponent_turns(turns.engine, "snapshot", s.seat, prompts.decode),
                    prompts,
                )
                self._aim_snapshot(s.seat, snapshot_lag(s, pool.last_k))

    def _aim_snapshot(self, seat: int, lag: int) -> None:
        """Point a snapshot seat at the policy ``lag`` syncs back: the engine of that lag, or an adapter of the policy's."""
        generator = self.opponents[seat][0]
        self.snapshot_lags[seat] = lag
        if self.snapshots:
            generator.engine = self.snapshots[lag] if lag else self.turns.engine
            generator.adapter_lag = 0
        else:
            generator.engine, generator.adapter_lag = self.turns.engine, lag

    async def run(
        self,
        spec: EpisodeSpec,
        lead: Trajectory,
        ensure_env: Callable[[dict[str, Any] | None], Awaitable[None]],
    ) -> Trajectory:
        """Play one game; returns the first policy seat's trajectory with the others in ``game_seats``.

        ``lead`` is the episode's trajectory as the EnvManager made it: it becomes the first
        policy seat's. Raises EnvCallError when the game or a scripted player fails.
        """
        await ensure_env(spec.env_config_override)
        self.phases.set_phase("reset")
        await self.env_calls.call("reset", spec.seed)
        players: dict[int, Player] = {
            seat: factory(seat_seed(spec.seed, seat))
            for seat, factory in self.players.items()
        }
        plays = self._seat_plays(lead)
        #: This game's draw for each pool seat (custom_envs.<Tag>.pool), from the episode's own seed.
        self.pool_lags = {
            s.seat: random.Random(
                f"{spec.seed}-{spec.group_id}-{spec.episode_id}-{s.seat}"
            ).randint(self.custom_env.pool.first_k(), self.custom_env.pool.last_k)
            for s in self.seats
            if s.player == POOL
        }
        for seat, lag in self.pool_lags.items():
            self._aim_snapshot(seat, lag)
        try:
            return await self._play_game(players, plays)
        finally:
            # a frozen model's or snapshot's Router releases the game's replica binding (the policy's: the EnvManager)
            for generator, _ in self.opponents.values():
                if generator.engine is self.turns.engine:
                    continue
                end_episode = getattr(generator.engine, "end_episode", None)
                if end_episode is not None:
                    end_episode()

    async def _play_game(
        self, players: dict[int, Player], plays: dict[int, _SeatPlay]
    ) -> Trajectory:
        instructions = [
            str(await self.env_calls.call("instruction", s.seat)) for s in self.seats
        ]
        done = False
        for move in range(MOVES_PER_TURN * self.custom_env.max_steps * len(self.seats)):
            seen: SeatObservation = await self.env_calls.call("get_observation")
            if seen.seat in players:
                reply = await self._scripted_reply(players[seen.seat], seen)
            elif seen.seat in plays:
                reply = await self._model_reply(
                    plays[seen.seat], seen, instructions[seen.seat]
                )
            else:
                raise EnvCallError(
                    f"game {self.custom_env.env_type!r} gave the move to seat {seen.seat}, but "
                    f"custom_envs.{self.tag}.seats lists {len(self.seats)} seats"
                )
            self.phases.set_phase("env_step", move)
            started = self._clock()
            result: TurnResult = await self.env_calls.call("step", reply)
            play = plays.get(seen.seat)
            if play is not None and play.trajectory.turns:
                record = play.trajectory.turns[-1]
                record.env_step_s = self._clock() - started
                record.metrics = {"game_invalid_move": float(result.invalid)}
            if result.done:
                done = True
                break
        outcome: GameOutcome | None = (
            await self.env_calls.call("close") if done else None
        )
        seats = [
            self._finish(play, outcome, instructions)
            for play in plays.values()
            if play.trained
        ]
        lead, others = seats[0], seats[1:]
        lead.game_seats = others
        return lead

    def _seat_plays(self, lead: Trajectory) -> dict[int, _SeatPlay]:
        """One conversation per model seat; the first policy seat's is ``lead`` itself."""
        base = lead.traj_id
        plays: dict[int, _SeatPlay] = {}
        for seat in (s for s in self.seats if s.kind != "scripted"):
            trained = seat.kind == "policy"
            if trained and not any(p.trained for p in plays.values()):
                trajectory = lead
            else:
                trajectory = Trajectory(
                    tag=lead.tag,
                    group_id=lead.group_id,
                    episode_id=lead.episode_id,
                    env_id=lead.env_id,
                    seed=lead.seed,
                    traj_id="",
                    created_step=lead.created_step,
                    started_at=lead.started_at,
                    episode_requested_at=lead.episode_requested_at,
                )
            trajectory.traj_id = (
                f"{base}-{seat.role if trained else f'{seat.kind}{seat.seat}'}"
            )
            trajectory.role = seat.role
            trajectory.opponents = "+".join(
                s.opponent_kind for s in self.seats if s.seat != seat.seat
            )
            turns, prompts = (
                (self.turns, self.prompts) if trained else self.opponents[seat.seat]
            )
            plays[seat.seat] = _SeatPlay(trajectory, turns, prompts, trained)
        return plays

    async def _scripted_reply(self, player: Player, seen: SeatObservation) -> str:
        self.phases.set_phase("env_step")
        try:
            action = player(seen.text, list(seen.legal_actions))
        except Exception as exc:
            raise EnvCallError(
                f"the scripted player of custom_envs.{self.tag}.seats[{seen.seat}] raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return str(await self.env_calls.call("format_action", str(action)))

    async def _model_reply(
        self, play: _SeatPlay, seen: SeatObservation, instruction: str
    ) -> str:
        """The seat's next turn: its observation appended to its own conversation, one request to its engine.

        A frozen seat's engine failing (after its retries) fails the game: an EnvCallError, so the
        episode is an ``env_error`` (counted and re-played), never the end of the rollout.
        """
        if not play.stopped and play.moves >= self.custom_env.max_steps:
            play.stopped = "max_steps"
        if play.stopped:
            return ""
        trajectory = play.trajectory
        fields = {
            "instruction": instruction,
            "observation": seen.text,
            "reward": 0.0,
            "turn": play.moves,
        }
        if play.moves == 0:
            ids = play.prompts.first_turn_ids(
                self.custom_env.fill(self.tag, "instruction_template", fields)
            )
        else:
            ids = play.prompts.closure_ids_after(
                play.last_generated
            ) + play.prompts.user_delta_ids(
                self.custom_env.fill(self.tag, "observation_template", fields)
            )
        room = self.sequence_length - len(trajectory.token_ids)
        if len(ids) >= room:  # not even one generated token would fit after it
            append_tokens(trajectory, ids[:room], generated=False)
            play.stopped = "max_length"
            return ""
        append_tokens(trajectory, ids, generated=False)
        if play.moves == 0:
            trajectory.prompt_length = len(ids)
        budget = self.sequence_length - len(trajectory.token_ids)
        try:
            generation = await play.turns.generate(
                trajectory, play.moves, min(self.custom_env.max_tokens_per_step, budget)
            )
        except EngineRequestError as exc:
            if play.trained:
                raise  # the policy's engine: the rollout's own failure (see TurnGenerator)
            raise EnvCallError(
                f"the {self.seats[seen.seat].kind} seat custom_envs.{self.tag}.seats[{seen.seat}] failed: {exc}"
            ) from exc
        append_tokens(
            trajectory,
            generation.token_ids,
            generated=True,
            logprobs=generation.logprobs,
            versions=generation.token_versions,
        )
        note_versions(trajectory, generation.weight_versions)
        action_text = play.prompts.decode(generation.token_ids)
        trajectory.turns.append(generation.turn_record(play.moves, action_text))
        play.moves += 1
        play.last_generated = list(generation.token_ids)
        if (
            len(trajectory.token_ids) >= self.sequence_length
            and generation.finish_reason != "stop"
        ):
            play.stopped = "max_length"  # the reply was cut: no half action
            return ""
        return action_text

    def _finish(
        self,
        play: _SeatPlay,
        outcome: GameOutcome | None,
        instructions: list[str],
    ) -> Trajectory:
        trajectory = play.trajectory
        seat = int(trajectory.role.removeprefix("seat"))
        if (
            not trajectory.token_ids
        ):  # the game ended before this seat moved: its prompt, nothing generated
            text = self.custom_env.fill(
                self.tag,
                "instruction_template",
                {
                    "instruction": instructions[seat],
                    "observation": outcome.reason if outcome else "",
                    "reward": 0.0,
                    "turn": 0,
                },
            )
            ids = self.prompts.first_turn_ids(text)[: self.sequence_length]
            append_tokens(trajectory, ids, generated=False)
            trajectory.prompt_length = len(ids)
        if outcome is None:
            trajectory.stop_reason = "max_steps"
        else:
            trajectory.stop_reason = play.stopped or "terminated"
        trajectory.metrics = {
            **episode_metrics(trajectory.turns),
            **game_metrics(seat, outcome),
            **{
                f"game_pool_lag_seat{other}": float(lag)
                for other, lag in self.pool_lags.items()
            },
            # every snapshot opponent's lag (fixed or drawn from the pool): the ratings need its version
            **{
                f"game_snapshot_lag_seat{seat}": float(lag)
                for seat, lag in self.snapshot_lags.items()
            },
        }
        if outcome is not None:
            trajectory.episode_reward = outcome.rewards[seat]
            if trajectory.turns:
                trajectory.turns[-1].reward = outcome.rewards[seat]
        trajectory.finished_at = time.time()
        return trajectory


def game_metrics(seat: int, outcome: GameOutcome | None) -> dict[str, float]:
    """Win, draw or loss of ``seat`` (its reward against the best other seat's) and its invalid moves."""
    if outcome is None:
        return {"game_unfinished": 1.0}
    mine = outcome.rewards[seat]
    best_other = max(r for i, r in enumerate(outcome.rewards) if i != seat)
    result = (
        "game_win"
        if mine > best_other
        else "game_loss"
        if mine < best_other
        else "game_draw"
    )
    metrics = {name: float(name == result) for name in GAME_OUTCOMES}
    metrics["game_invalid_moves"] = float(outcome.invalid_moves[seat])
    metrics["game_unfinished"] = 0.0
    return metrics
