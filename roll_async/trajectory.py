"""Data types that cross component boundaries: engine requests/results and trajectories.

Everything here is plain dataclasses (picklable for Ray, JSON-able for the run
directory). One trajectory type for the whole project: EnvManagers build it,
the scheduler groups it, the collator turns a batch of it into tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

#: ``error``: vLLM's retryable request-level fault; the EnvManager retries it and never trains on its output.
FinishReason = Literal["stop", "length", "abort", "error"]

#: Why an episode ended. ``aborted`` is used when a sync-mode pause or a
#: shutdown cancels an episode that had not finished; such trajectories are
#: never handed to the trainer.
StopReason = Literal[
    "terminated", "max_steps", "max_length", "env_error", "engine_error", "aborted"
]


@dataclass
class GenerationRequest:
    """One generate call: token ids in, sampling settings per request."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = True
    ignore_eos: bool = False
    #: Images of the conversation so far in placeholder order, e.g. ``{"image": [PIL.Image, ...]}``; the
    #: prompt ids then hold one image token per image (vLLM expands it; see roll_async.prompts.images).
    multi_modal_data: dict[str, list[Any]] | None = None
    #: LoRA serving (trainer.lora.sync=adapter): run on the adapter this many versions older than the newest
    #: loaded (the oldest loaded while fewer exist); 0: the newest. A ``snapshot:<k>`` game seat's requests.
    adapter_lag: int = 0


@dataclass
class GenerationResult:
    """Output of one generate call; ``weight_version`` is the version that sampled its last token.

    ``logprobs`` are those of the distribution that sampled each token (temperature, top-k,
    top-p applied and renormalised; see ``roll_async.sampling``).
    """

    request_id: str
    output_token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    #: The engine's own detokenization: only where the request had stop strings (else ""); callers decode
    #: ``output_token_ids`` with their prompt builder.
    text: str = ""
    num_prompt_tokens: int = 0
    #: The weight version that sampled each output token (same length as ``output_token_ids``);
    #: a request that spans an update in pause mode ``keep`` has two versions.
    token_versions: list[int] = field(default_factory=list)


@dataclass
class TurnRecord:
    """One model turn followed by one env step.

    Attributes:
        turn: The turn's index in the episode, from 0.
        action_text: The model's reply, as handed to the env's ``step``.
        observation: The env's answer to it.
        reward: The env's reward for the step.
        generated_tokens: Tokens the model generated this turn.
        weight_version: The weight version that sampled the turn's last token.
        generate_s: Seconds spent generating the reply.
        env_step_s: Seconds the env's ``step`` took.
        finish_reason: How the generation ended: ``stop``, ``length``, ``abort`` or ``error``.
        metrics: The env's per-step metrics (``info["metrics"]``).
        generate_finished_at: See ``generate_started_at``.
        env_step_started_at: See ``generate_started_at``.
        env_step_finished_at: See ``generate_started_at``.
        reward_finished_at: See ``reward_started_at``.
    """

    turn: int
    action_text: str
    observation: str
    reward: float
    generated_tokens: int
    weight_version: int
    generate_s: float
    env_step_s: float
    finish_reason: str = "stop"
    metrics: dict[str, float] = field(default_factory=dict)
    #: Times this turn's generation was aborted (engine pause/abort) and continued from its partial output.
    resumed_generations: int = 0
    #: Weight versions of every piece of this turn's generation, in order (``weight_version`` is the last).
    weight_versions: list[int] = field(default_factory=list)
    #: Wall-clock spans of this turn (unix seconds; 0.0 when the phase did not run), for the report timeline.
    generate_started_at: float = 0.0
    generate_finished_at: float = 0.0
    env_step_started_at: float = 0.0
    env_step_finished_at: float = 0.0
    #: Images in the observation this turn's env step returned (render_mode: vision).
    num_images: int = 0
    #: When a reward model (custom_envs.<Tag>.reward with per_turn) started and finished scoring this turn (unix
    #: seconds; 0.0: not scored per turn). It starts after the env step and may overlap the next turns.
    reward_started_at: float = 0.0
    reward_finished_at: float = 0.0


@dataclass
class EnvSpan:
    """A named stretch of an env's own work in an episode, for the report timeline (unix seconds).

    An env reports them in ``info["env_spans"]`` of ``reset`` and ``step`` as
    ``{"name", "started_at", "finished_at"}`` (the swe env: ``workspace_start_warm`` or ``_cold``, each ``exec``,
    ``verify``); the EnvManager keeps them on the trajectory and the report draws each name as
    sub-spans of the episode's row.

    Attributes:
        name: What the env did (one legend entry per name).
        started_at: When it started (``time.time()``, the clock of the turn spans).
        finished_at: When it finished.
        turn: The turn whose env step it ran in; -1 during ``reset``.
    """

    name: str
    started_at: float
    finished_at: float
    turn: int = -1


@dataclass
class Trajectory:
    """One episode of one env instance, token-exact.

    ``token_ids`` is the whole conversation exactly as the engine saw it;
    ``response_mask`` is 1 on tokens the model generated, ``logprobs`` holds the
    engine's behaviour logprobs there (0.0 elsewhere). ``prompt_length`` is the
    length of the first-turn prompt (system + instruction + first observation).

    Attributes:
        tag: The ``custom_envs`` tag of the env.
        group_id: The group the episode belongs to (its episodes share a seed).
        episode_id: The episode's index within its group.
        env_id: The env instance that played it.
        seed: The seed the env was reset with.
        traj_id: A unique id, used in logs and the run directory.
        created_step: The training step the episode's group was created for.
        token_ids: The whole conversation's token ids, as the engine saw them.
        response_mask: 1 on tokens the model generated, 0 elsewhere.
        logprobs: The engine's logprob of each generated token (0.0 elsewhere).
        prompt_length: The first-turn prompt's length in tokens.
        turns: One record per model turn and env step.
        episode_reward: The sum of the turns' rewards (plus a reward model's score, if any).
        stop_reason: Why the episode ended: ``terminated``, ``max_steps``, ``max_length``,
            ``env_error``, ``engine_error`` or ``aborted`` (never trained on).
        error: The failure's message when the episode ended with an error, else None.
        oldest_weight_version: The oldest weight version that sampled a token of it.
        newest_weight_version: The newest weight version that sampled a token of it.
        started_at: When the episode started (unix seconds).
        finished_at: When the episode finished (unix seconds).
        metrics: Episode metrics (the env's per-step metrics and the episode's own).
        env_spans: The env's own named spans (workspace start, commands, verifier), in order.
    """

    tag: str
    group_id: int
    episode_id: int
    env_id: int
    seed: int
    traj_id: str
    created_step: int
    token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: Weight version that sampled each token, aligned with ``token_ids``; -1 on tokens not generated.
    token_versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    episode_reward: float = 0.0
    stop_reason: str = "terminated"
    error: str | None = None
    oldest_weight_version: int | None = None
    newest_weight_version: int | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    #: When the env asked the scheduler for this episode (unix seconds); until ``started_at`` it waited for one.
    episode_requested_at: float = 0.0
    #: When a reward model (custom_envs.<Tag>.reward) started and finished scoring the episode (unix seconds; 0.0:
    #: not scored, or scored per turn: see TurnRecord). It runs before ``finished_at``, so the episode's span includes it.
    reward_started_at: float = 0.0
    reward_finished_at: float = 0.0
    #: Observation images in placeholder order (vision envs), and each one's [start, end) span in token_ids.
    images: list[Any] = field(default_factory=list)
    image_spans: list[tuple[int, int]] = field(default_factory=list)
    #: Games with seats (custom_envs.<Tag>.seats): the seat this trajectory played, ``seat0``, ``seat1``, ...;
    #: "" for a single-agent env. The trainer normalises advantages per (group, role).
    role: str = ""
    #: Games: who played the other seats, by kind (``policy``, ``random``, ``heuristic``, ``scripted``; several
    #: joined by ``+`` in seat order); "" for a single-agent env. Game metrics are logged per role and opponents.
    opponents: str = ""
    #: The other trained seats of the same game, handed over with this one (the game's first policy seat)
    #: so the queue keeps, drops or re-plays a game whole; the queue flattens them when it serves.
    game_seats: list[Trajectory] = field(default_factory=list)
    env_spans: list[EnvSpan] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def response_length(self) -> int:
        return int(sum(self.response_mask))

    def to_record(self, decoded_text: str | None = None) -> dict[str, Any]:
        """The JSON line written to ``trajectories.jsonl`` (no token arrays)."""
        record = {
            "traj_id": self.traj_id,
            "tag": self.tag,
            "group_id": self.group_id,
            "episode_id": self.episode_id,
            "env_id": self.env_id,
            "seed": self.seed,
            "role": self.role,
            "opponents": self.opponents,
            "episode_reward": self.episode_reward,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "created_step": self.created_step,
            "oldest_weight_version": self.oldest_weight_version,
            "newest_weight_version": self.newest_weight_version,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "episode_requested_at": self.episode_requested_at,
            "reward_started_at": self.reward_started_at,
            "reward_finished_at": self.reward_finished_at,
            "num_tokens": len(self.token_ids),
            "num_images": len(self.images),
            "response_length": self.response_length,
            "metrics": self.metrics,
            "turns": [dataclasses.asdict(t) for t in self.turns],
            "env_spans": [dataclasses.asdict(s) for s in self.env_spans],
        }
        if decoded_text is not None:
            record["text"] = decoded_text
        return record


def with_game_seats(
    trajectories: list[Trajectory], *, detach: bool = False
) -> list[Trajectory]:
    """Each trajectory followed by the other trained seats of its game (``game_seats``), in order.

    ``detach``: empty each ``game_seats`` on the way (the queue serving a batch), so no seat is
    shipped twice, nested and flat.
    """
    flat: list[Trajectory] = []
    for trajectory in trajectories:
        flat.append(trajectory)
        flat.extend(trajectory.game_seats)
        if detach:
            trajectory.game_seats = []
    return flat


@dataclass
class EpisodeSpec:
    """What the scheduler hands an EnvManager: which episode to play and for which step."""

    tag: str
    group_id: int
    episode_id: int
    seed: int
    created_step: int
    env_config_override: dict[str, Any] | None = None
