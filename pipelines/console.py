"""The one console line per step that pipelines print (the full metrics go to metrics.jsonl)."""

from __future__ import annotations

from roll_async import metrics as m


def _get(metrics: dict[str, float], key: str) -> float:
    value = metrics.get(key)
    return float("nan") if value is None else float(value)


def success_text(metrics: dict[str, float]) -> str:
    """Mean of the per-tag ``env/<tag>/success`` metrics, or n/a when no env reports success."""
    values = [
        v for k, v in metrics.items() if k.startswith("env/") and k.endswith("/success")
    ]
    return f"{sum(values) / len(values):.2f}" if values else "n/a"


def reward_model_text(metrics: dict[str, float]) -> str:
    """`` | reward model 0.41s p99 0.90s, 2 failed`` when a judge / reward model scored the batch, else ''."""
    if m.TIME_REWARD_MEAN not in metrics:
        return ""
    return (
        f" | reward model {_get(metrics, m.TIME_REWARD_MEAN):.2f}s p99 {_get(metrics, m.TIME_REWARD_P99):.2f}s,"
        f" {_get(metrics, m.REWARD_FAILURES):.0f} failed"
    )


def format_rollout_line(step: int, metrics: dict[str, float]) -> str:
    return (
        f"step {step}: trajectories/s {_get(metrics, m.TRAJECTORIES_PER_S):.2f}"
        f" | tokens/s {_get(metrics, m.TOKENS_PER_S):.0f}"
        f" | reward {_get(metrics, m.EPISODE_REWARD_MEAN):.3f} | success {success_text(metrics)}"
        f" | turns {_get(metrics, m.TURNS_MEAN):.1f} | wait {_get(metrics, m.GET_BATCH_WAIT_S):.2f}s"
        f" | staleness max {_get(metrics, m.STALENESS_MAX):.0f} | env errors {_get(metrics, m.ENV_ERRORS):.0f}"
        + reward_model_text(metrics)
    )


def format_train_line(step: int, metrics: dict[str, float]) -> str:
    return (
        f"step {step}: reward {_get(metrics, m.EPISODE_REWARD_MEAN):.3f} | success {success_text(metrics)}"
        f" | loss {_get(metrics, 'train/loss'):.4f} | traj/s {_get(metrics, m.TRAJECTORIES_PER_S):.2f}"
        f" | staleness max {_get(metrics, m.STALENESS_MAX):.0f}"
        f" | time rollout {_get(metrics, m.TIME_STEP_ROLLOUT):.1f}s train {_get(metrics, m.TIME_STEP_TRAIN):.1f}s"
        f" sync {_get(metrics, m.TIME_STEP_WEIGHT_SYNC):.2f}s total {_get(metrics, m.TIME_STEP_TOTAL):.1f}s"
        + reward_model_text(metrics)
    )
