"""The one metrics registry: metric names and the functions that compute them.

Every metric the project logs is named here, so dashboards, ``metrics.jsonl``
and tests agree. ``rollout_metrics`` is computed for every ``get_batch``;
``validation_metrics`` for every evaluation; trainers use the ``TRAIN_*`` names
and ``summarize``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from roll_async.trajectory import Trajectory

# -- rollout ---------------------------------------------------------------------------
TRAJECTORIES_PER_S = "rollout/trajectories_per_s"
TOKENS_PER_S = "rollout/tokens_per_s"
GET_BATCH_WAIT_S = "rollout/get_batch_wait_s"
TURNS_MEAN = "rollout/turns/mean"
TURNS_MAX = "rollout/turns/max"
RESPONSE_LENGTH_MEAN = "rollout/response_length/mean"
RESPONSE_LENGTH_MAX = "rollout/response_length/max"
NATURAL_TERMINATION_RATE = "rollout/natural_termination_rate"
TRUNCATION_RATE = "rollout/truncation_rate"
MAX_STEPS_RATE = "rollout/max_steps_rate"
STALENESS_MEAN = "rollout/staleness/mean"
STALENESS_MAX = "rollout/staleness/max"
#: The version the engines serve at this step (see rollout_metrics) minus the oldest version a trajectory used.
WEIGHT_LAG_MEAN = "rollout/weight_version_lag/mean"
WEIGHT_LAG_MAX = "rollout/weight_version_lag/max"
DROPPED_STALE_GROUPS = "rollout/dropped_stale_groups"
#: Groups created since the previous batch, and the groups pending when this batch was served: with the groups
#: served and dropped (stale, filtered, errors) they account for every group (none lost).
CREATED_GROUPS = "rollout/created_groups"
PENDING_GROUPS = "rollout/pending_groups"
FILTERED_GROUPS = "rollout/filtered_groups"
FILTER_BYPASSED_GROUPS = "rollout/filter_bypassed_groups"
ENV_ERRORS = "rollout/env_errors"
DROPPED_ERROR_GROUPS = "rollout/dropped_error_groups"
CANCELLED_EPISODES = "rollout/cancelled_episodes"
#: EnvManagerWorkers restarted after they died (train_env_manager.max_worker_restarts bounds them).
WORKER_RESTARTS = "rollout/worker_restarts"
#: Episodes in flight on a worker when it died: their seats re-opened; not env errors (no error budget spent).
EPISODES_LOST_TO_RESTART = "rollout/episodes_lost_to_restart"
#: Call connections (episode hand-overs, engine requests) that dropped while the actor lived; the calls in
#: flight failed with CallConnectionLost and were retried. Summed over the EnvManagerWorkers, per batch.
TRANSPORT_RECONNECTS = "rollout/transport_reconnects"
STALLED_ENVS = "rollout/stalled_envs"
RESUMED_GENERATIONS = "rollout/resumed_generations"
#: Agent sessions: calls that rewrote history and so started a new token segment (summed over the batch).
AGENT_SEGMENT_BREAKS = "rollout/agent_segment_breaks"
#: Agent sessions: replies that looked like a tool call but did not parse (returned as content; summed).
AGENT_TOOL_PARSE_ERRORS = "rollout/agent_tool_parse_errors"
#: Agent sessions: replies without the call tool_choice (required / a named function) asked for (summed).
AGENT_TOOL_CHOICE_UNMET = "rollout/agent_tool_choice_unmet"
#: Agent sessions: parsed tool calls returned to agents (summed).
AGENT_TOOL_CALLS = "rollout/agent_tool_calls"
#: Agent sessions: extending calls whose echoed assistant turns matched by meaning, not bytes (summed).
AGENT_ECHOES_BY_MEANING = "rollout/agent_echoes_by_meaning"
#: Agent episodes cut by max_steps / sequence_length whose agent raised instead of returning: reward 0 (summed).
AGENT_UNREWARDED_LIMITS = "rollout/agent_unrewarded_limits"
#: Share of checked trajectories whose ids differ from a fresh render of their text (template rewrites history).
PREFIX_MISMATCH_RATE = "rollout/prefix_mismatch_rate"
#: Per-trajectory flag (Trajectory.metrics key) set by EnvManagers on every PREFIX_CHECK_EVERY_EPISODES-th episode.
PREFIX_MISMATCH = "prefix_mismatch"
PREFIX_CHECK_EVERY_EPISODES = 4
#: Share of env-seconds in the batch window spent playing episodes (not waiting for a seat).
ENV_BUSY_FRACTION = "rollout/env_busy_fraction"
#: Share of the served groups that were already pending when the previous batch was served (carried over).
GROUPS_STARTED_EARLIER_FRACTION = "rollout/groups_started_earlier_fraction"
EPISODE_REWARD_MEAN = "rollout/episode_reward/mean"
EPISODE_REWARD_STD = "rollout/episode_reward/std"
ENGINE_RUNNING = "engine/running"
ENGINE_WAITING = "engine/waiting"
ENGINE_KV_CACHE_USAGE = "engine/kv_cache_usage"
#: Engine replicas still alive as the driver's weight syncs see them (engine/replica_fleet.py).
ENGINE_LIVE_REPLICAS = "engine/live_replicas"
TIME_GENERATE_MEAN = "time/generate/mean"
TIME_GENERATE_P99 = "time/generate/p99"
TIME_ENV_STEP_MEAN = "time/env_step/mean"
TIME_ENV_STEP_P99 = "time/env_step/p99"

# -- rewards from models (roll_async/rewards: LLM judge, reward model) ----------------
TIME_REWARD_MEAN = "time/reward/mean"
TIME_REWARD_P99 = "time/reward/p99"
#: Scoring calls (one per episode, or per turn with per_turn) whose model reward could not be had (timeouts, errors,
#: unparsable judge replies): zero model reward for that episode or turn.
REWARD_FAILURES = "rollout/reward_failures"
REWARD_TIMEOUTS = "rollout/reward_timeouts"
REWARD_PARSE_FAILURES = "rollout/reward_parse_failures"
REWARD_RETRIES = "rollout/reward_retries"
#: Per-trajectory keys (Trajectory.metrics) set by rewards.EpisodeRewardScorer; the batch metrics above sum them.
#: Scored per turn, each scored TurnRecord.metrics holds them for its call, and the trajectory's are the sums
#: (``model_reward_s``: total seconds; ``model_reward_score``: the mean score) with the count of scored turns.
MODEL_REWARD_SCORE = "model_reward_score"
MODEL_REWARD_S = "model_reward_s"
MODEL_REWARD_FAILED = "model_reward_failed"
MODEL_REWARD_TIMEOUTS = "model_reward_timeouts"
MODEL_REWARD_PARSE_FAILED = "model_reward_parse_failed"
MODEL_REWARD_RETRIES = "model_reward_retries"
ENV_REWARD = "env_reward"
MODEL_REWARD_TURNS = "model_reward_turns"

# -- train -----------------------------------------------------------------------------
TRAIN_LOSS = "train/loss"
TRAIN_REWARD_MEAN = "train/reward/mean"
TRAIN_REWARD_STD = "train/reward/std"
TRAIN_IMPORTANCE_RATIO_MEAN = "train/importance_ratio/mean"
TRAIN_IMPORTANCE_RATIO_MAX = "train/importance_ratio/max"
#: Share of response tokens dropped from the loss by trainer.max_token_lag, and the largest token lag seen.
TRAIN_TOKEN_LAG_MASKED_FRACTION = "train/token_lag/masked_fraction"
TRAIN_TOKEN_LAG_MAX = "train/token_lag/max"
#: Micro-batches of the step with no scored token (all masked by max_token_lag, or prompts that fill
#: sequence_length): skipped, not backwarded. Counted once per pass over the batch.
TRAIN_SKIPPED_MICRO_BATCHES = "train/skipped_micro_batches"
#: Optimizer steps the train step made: ppo_epochs, or 0 when every micro-batch was skipped.
TRAIN_OPTIMIZER_STEPS = "train/optimizer_steps"
TIME_STEP_ROLLOUT = "time/step_rollout"
TIME_STEP_TRAIN = "time/step_train"
TIME_STEP_WEIGHT_SYNC = "time/step_weight_sync"
TIME_STEP_TOTAL = "time/step_total"


def env_metric(tag: str, name: str) -> str:
    """Per-tag env metric, e.g. ``env/sokoban/success``."""
    return f"env/{tag}/{name}"


#: Games with seats: per-seat Trajectory.metrics keys (env_managers/game_episode.py) -> the rate logged per role
#: and opponent kind under game_metric(tag, role, opponents, <rate>).
GAME_RATES: dict[str, str] = {
    "game_win": "win_rate",
    "game_draw": "draw_rate",
    "game_loss": "loss_rate",
    "game_invalid_move": "invalid_move_rate",
}


#: Elo-style ratings of a game tag's policy against its own snapshots, per served batch
#: (roll_async.envs.multiplayer.ratings): the newest version's rating, the mean of the snapshot
#: versions it faced, and how many games were rated.
GAME_RATINGS = ("policy_elo", "pool_elo", "elo_games")


def game_rating_metric(tag: str, name: str) -> str:
    """``game/<tag>/policy_elo`` and the other GAME_RATINGS names of a game tag."""
    return f"game/{tag}/{name}"


def game_metric(tag: str, role: str, opponents: str, name: str) -> str:
    """Per game tag, seat role and opponent kind, e.g. ``game/KuhnPoker/seat0/vs_heuristic/win_rate``."""
    return f"game/{tag}/{role}/vs_{opponents}/{name}"


#: Scheduler counter fields (group_queue.SchedulerCounters) -> metric names.
COUNTER_METRICS: dict[str, str] = {
    "dropped_stale_groups": DROPPED_STALE_GROUPS,
    "filtered_groups": FILTERED_GROUPS,
    "filter_bypassed_groups": FILTER_BYPASSED_GROUPS,
    "env_errors": ENV_ERRORS,
    "dropped_error_groups": DROPPED_ERROR_GROUPS,
    "cancelled_episodes": CANCELLED_EPISODES,
    "worker_restarts": WORKER_RESTARTS,
    "episodes_lost_to_restart": EPISODES_LOST_TO_RESTART,
    "created_groups": CREATED_GROUPS,
}


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def summarize(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{prefix}/mean``, ``/max``, ``/min``, ``/std``, ``/p99`` of ``values``."""
    return {
        f"{prefix}/mean": mean(values),
        f"{prefix}/max": float(max(values)) if values else 0.0,
        f"{prefix}/min": float(min(values)) if values else 0.0,
        f"{prefix}/std": std(values),
        f"{prefix}/p99": percentile(values, 99),
    }


def _rate(trajectories: Sequence[Trajectory], *reasons: str) -> float:
    if not trajectories:
        return 0.0
    return sum(t.stop_reason in reasons for t in trajectories) / len(trajectories)


def _env_metrics(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    by_tag: dict[str, dict[str, list[float]]] = {}
    for t in trajectories:
        values = by_tag.setdefault(t.tag, {})
        values.setdefault("episode_reward", []).append(t.episode_reward)
        values.setdefault("num_turns", []).append(float(t.num_turns))
        for key, value in t.metrics.items():
            values.setdefault(key, []).append(float(value))
    return {
        env_metric(tag, key): mean(vals)
        for tag, metrics in by_tag.items()
        for key, vals in metrics.items()
    }


def _game_metrics(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """Win, draw and loss rates and the invalid-move rate (per reply) of each (tag, role, opponent kind)."""
    by_seat: dict[str, list[float]] = {}
    for t in trajectories:
        if not t.role:
            continue
        for key, name in GAME_RATES.items():
            if key in t.metrics:
                metric = game_metric(t.tag, t.role, t.opponents, name)
                by_seat.setdefault(metric, []).append(float(t.metrics[key]))
    return {metric: mean(values) for metric, values in by_seat.items()}


def engine_metrics(stats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Sum of running/waiting over replicas, mean KV-cache usage."""
    if not stats:
        return {}
    return {
        ENGINE_RUNNING: float(sum(s.get("running", 0) for s in stats)),
        ENGINE_WAITING: float(sum(s.get("waiting", 0) for s in stats)),
        ENGINE_KV_CACHE_USAGE: mean(
            [float(s.get("kv_cache_usage", 0.0)) for s in stats]
        ),
    }


def replica_metrics(
    engine_stats: Sequence[Mapping[str, float]] = (),
    router_stats: Sequence[Mapping[str, Any]] = (),
) -> dict[str, float]:
    """Per engine replica: ``engine/replica_<i>/{running,waiting,in_flight}`` from the engines' stats, and
    ``router/replica_<i>/{requests,bound_episodes,rebalanced_away,failed_over,dead}`` summed over the workers'
    Routers (``Router.stats``), plus ``router/dead_replicas``, and ``rollout/transport_reconnects`` from each
    worker's ``transport_reconnects`` (dropped call connections since its previous report)."""
    out: dict[str, float] = {}
    for i, stats in enumerate(engine_stats):
        for key in ("running", "waiting", "in_flight"):
            if key in stats:
                out[f"engine/replica_{i}/{key}"] = float(stats[key])
    dead: dict[int, bool] = {}
    for worker in router_stats:
        for i, replica in enumerate(worker.get("replicas", [])):
            for key in ("requests", "bound_episodes", "rebalanced_away", "failed_over"):
                name = f"router/replica_{i}/{key}"
                out[name] = out.get(name, 0.0) + float(replica.get(key, 0))
            dead[i] = dead.get(i, False) or bool(replica.get("dead"))
    for i, is_dead in dead.items():
        out[f"router/replica_{i}/dead"] = float(is_dead)
    if dead:
        out["router/dead_replicas"] = float(sum(dead.values()))
    if router_stats:
        out[TRANSPORT_RECONNECTS] = float(
            sum(int(w.get("transport_reconnects", 0)) for w in router_stats)
        )
    return out


def rollout_metrics(
    batch: Sequence[Trajectory],
    *,
    step: int,
    wait_s: float = 0.0,
    window_s: float = 0.0,
    counters: Mapping[str, float] | None = None,
    gauges: Mapping[str, float] | None = None,
    engine_stats: Sequence[Mapping[str, float]] | None = None,
    version_base: int = 0,
) -> dict[str, float]:
    """Metrics of one ``get_batch``: throughput over ``window_s``, batch shape, staleness, scheduler events.

    The weight-version lag is measured against the version the engines serve now: the newest
    ``weight_version`` in ``engine_stats``, else ``version_base + step`` (``version_base``: the engines'
    version at step 0, not 0 when they started further on, e.g. a resumed run's), never the step number.
    """
    turns = [float(t.num_turns) for t in batch]
    lengths = [float(t.response_length) for t in batch]
    generated = sum(t.response_length for t in batch)
    staleness = [float(step - t.created_step) for t in batch]
    reported = [
        int(s["weight_version"]) for s in engine_stats or [] if "weight_version" in s
    ]
    serving = max(reported) if reported else version_base + step
    lags = [
        float(serving - t.oldest_weight_version)
        for t in batch
        if t.oldest_weight_version is not None
    ]
    generate_s = [turn.generate_s for t in batch for turn in t.turns]
    env_step_s = [turn.env_step_s for t in batch for turn in t.turns]
    rewards = [t.episode_reward for t in batch]
    out: dict[str, float] = {
        TRAJECTORIES_PER_S: len(batch) / window_s if window_s > 0 else 0.0,
        TOKENS_PER_S: generated / window_s if window_s > 0 else 0.0,
        GET_BATCH_WAIT_S: float(wait_s),
        TURNS_MEAN: mean(turns),
        TURNS_MAX: max(turns, default=0.0),
        RESPONSE_LENGTH_MEAN: mean(lengths),
        RESPONSE_LENGTH_MAX: max(lengths, default=0.0),
        NATURAL_TERMINATION_RATE: _rate(batch, "terminated"),
        TRUNCATION_RATE: _rate(batch, "max_length"),
        MAX_STEPS_RATE: _rate(batch, "max_steps"),
        STALENESS_MEAN: mean(staleness),
        STALENESS_MAX: max(staleness, default=0.0),
        WEIGHT_LAG_MEAN: mean(lags),
        WEIGHT_LAG_MAX: max(lags, default=0.0),
        EPISODE_REWARD_MEAN: mean(rewards),
        EPISODE_REWARD_STD: std(rewards),
        RESUMED_GENERATIONS: float(
            sum(turn.resumed_generations for t in batch for turn in t.turns)
        ),
        AGENT_SEGMENT_BREAKS: float(
            sum(t.metrics.get("agent_segment_breaks", 0.0) for t in batch)
        ),
        AGENT_TOOL_PARSE_ERRORS: float(
            sum(t.metrics.get("agent_tool_parse_errors", 0.0) for t in batch)
        ),
        AGENT_TOOL_CHOICE_UNMET: float(
            sum(t.metrics.get("agent_tool_choice_unmet", 0.0) for t in batch)
        ),
        AGENT_TOOL_CALLS: float(
            sum(t.metrics.get("agent_tool_calls", 0.0) for t in batch)
        ),
        AGENT_ECHOES_BY_MEANING: float(
            sum(t.metrics.get("agent_echoes_by_meaning", 0.0) for t in batch)
        ),
        AGENT_UNREWARDED_LIMITS: float(
            sum(t.metrics.get("agent_unrewarded_limit", 0.0) for t in batch)
        ),
        PREFIX_MISMATCH_RATE: mean(
            [t.metrics[PREFIX_MISMATCH] for t in batch if PREFIX_MISMATCH in t.metrics]
        ),
        TIME_GENERATE_MEAN: mean(generate_s),
        TIME_GENERATE_P99: percentile(generate_s, 99),
        TIME_ENV_STEP_MEAN: mean(env_step_s),
        TIME_ENV_STEP_P99: percentile(env_step_s, 99),
    }
    for field_name, metric_name in COUNTER_METRICS.items():
        out[metric_name] = float((counters or {}).get(field_name, 0))
    out[STALLED_ENVS] = float((gauges or {}).get("stalled_envs", 0))
    for gauge, metric_name in (
        ("pending_groups", PENDING_GROUPS),
        ("env_busy_fraction", ENV_BUSY_FRACTION),
        ("groups_started_earlier_fraction", GROUPS_STARTED_EARLIER_FRACTION),
    ):
        if gauge in (gauges or {}):
            out[metric_name] = float(gauges[gauge])  # type: ignore[index]
    out.update(_env_metrics(batch))
    out.update(_game_metrics(batch))
    out.update(engine_metrics(engine_stats or []))
    out.update(reward_batch_metrics(batch))
    return out


def reward_batch_metrics(batch: Sequence[Trajectory]) -> dict[str, float]:
    """``time/reward/{mean,p99}`` and the ``rollout/reward_*`` counts over the trajectories a model scored ({} if none).

    The scorer (roll_async.rewards.scorer) runs inside EnvManagers in many processes, so the batch's reward
    latency and failure counts are rebuilt from what it left in each Trajectory.metrics.
    """
    scored = [t for t in batch if MODEL_REWARD_S in t.metrics]
    if not scored:
        return {}
    seconds = [s for t in scored for s in _reward_call_seconds(t)]

    def total(key: str) -> float:
        return float(sum(t.metrics.get(key, 0.0) for t in scored))

    return {
        TIME_REWARD_MEAN: mean(seconds),
        TIME_REWARD_P99: percentile(seconds, 99),
        REWARD_FAILURES: total(MODEL_REWARD_FAILED),
        REWARD_TIMEOUTS: total(MODEL_REWARD_TIMEOUTS),
        REWARD_PARSE_FAILURES: total(MODEL_REWARD_PARSE_FAILED),
        REWARD_RETRIES: total(MODEL_REWARD_RETRIES),
    }


def _reward_call_seconds(trajectory: Trajectory) -> list[float]:
    """One latency per scoring call: each scored turn's (reward.per_turn), else the episode's."""
    if MODEL_REWARD_TURNS not in trajectory.metrics:
        return [trajectory.metrics[MODEL_REWARD_S]]
    return [
        t.metrics[MODEL_REWARD_S]
        for t in trajectory.turns
        if MODEL_REWARD_S in t.metrics
    ]


def validation_metrics(
    trajectories: Sequence[Trajectory], prefix: str = "val"
) -> dict[str, float]:
    """Per-tag and overall metrics of one evaluation round: ``val/<tag>/<metric>`` and ``val/<metric>``."""
    out: dict[str, float] = {
        f"{prefix}/episode_reward/mean": mean([t.episode_reward for t in trajectories]),
        f"{prefix}/num_episodes": float(len(trajectories)),
        f"{prefix}/env_errors": float(
            sum(t.stop_reason == "env_error" for t in trajectories)
        ),
        f"{prefix}/natural_termination_rate": _rate(trajectories, "terminated"),
        f"{prefix}/truncation_rate": _rate(trajectories, "max_length"),
        f"{prefix}/max_steps_rate": _rate(trajectories, "max_steps"),
    }
    successes = [t.metrics["success"] for t in trajectories if "success" in t.metrics]
    if successes:
        out[f"{prefix}/success"] = mean(successes)
    for name, value in _env_metrics(trajectories).items():
        out[prefix + name[len("env") :]] = (
            value  # env/<tag>/<metric> -> val/<tag>/<metric>
        )
    for name, value in _game_metrics(trajectories).items():
        out[f"{prefix}/{name}"] = value  # val/game/<tag>/<role>/vs_<opponents>/<rate>
    return out
