"""The built-in agent of ``env_type: verifiers:<env id>`` tags: one verifiers rollout per episode, on the session's endpoint.

A verifiers environment owns its conversation (prompt, turns, parser, rubric), so roll-async plays it as an
agent session: the rollout's model calls go through the session's OpenAI client, which keeps the history
token-exact, and the rubric's reward and per-function scores come back as the episode's reward and metrics.
The group's seed picks the dataset row, so every episode of a group plays the same row.
"""

from __future__ import annotations

from typing import Any

from roll_async.agent_gateway.task import AgentTask
from roll_async.envs.adapters.verifiers_env import load_verifiers_env, row_for_seed


async def verifiers_agent(client: Any, task: AgentTask) -> dict[str, Any]:
    """Play ``task.seed``'s row of the tag's verifiers environment; ``{"reward", "metrics"}`` for the session."""
    key = f"custom_envs.{task.tag}.env_type"
    env = load_verifiers_env(task.env_type, task.env_config, key)
    row = row_for_seed(task.seed, env.num_rows)
    result = await env.rollout(row, client, task.model, task.max_tokens)
    return {
        "reward": result.reward,
        "metrics": {**result.metrics, "verifiers_row": float(row)},
    }
