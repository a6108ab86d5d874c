"""Agents for workspace episodes (``env_type: swe`` with ``agent``) that fail on purpose, for the tests.

Each makes one model call first (an agent episode without one has nothing to train on), runs the
fenced command of its reply through ``task.workspace`` and then misbehaves: raises, hangs past the
agent time, or claims a reward it did not earn. The tests check that the workspace is scored or
closed all the same (tests/unit/envs/swe/test_agent_workspace.py).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import openai

from roll_async.agent_gateway.task import AgentTask

_FENCE = re.compile(r"```(?:bash|sh)?[ \t]*\n(.*?)```", re.DOTALL)


async def _first_command(client: openai.AsyncOpenAI, task: AgentTask) -> dict[str, Any]:
    """Ask the model once and run the fenced command of its reply in the workspace."""
    assert task.workspace is not None, "a workspace agent runs on env_type: swe"
    reply = await client.chat.completions.create(
        model=task.model,
        messages=[{"role": "user", "content": task.workspace.instruction}],
        max_tokens=task.max_tokens,
    )
    blocks = _FENCE.findall(reply.choices[0].message.content or "")
    return await task.workspace.aexecute(blocks[0] if blocks else "true")


async def raising_agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
    """Runs its command (e.g. one that leaves a process behind), then raises."""
    result = await _first_command(client, task)
    raise RuntimeError(
        f"the agent broke after its first command, which printed {result['output']!r}"
    )


async def hanging_agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
    """Runs its command, then waits without calling the model again, past the agent time."""
    await _first_command(client, task)
    await asyncio.sleep(3600)
    return 0.0


async def claiming_agent(client: openai.AsyncOpenAI, task: AgentTask) -> dict[str, Any]:
    """Runs its command and claims full marks: the verifier's verdict must win."""
    await _first_command(client, task)
    return {"reward": 1.0, "metrics": {"success": 1.0, "claimed": 1.0}}
