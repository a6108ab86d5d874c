"""Agents written only against the openai client, for agent-session tests (configs name them by path)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai


async def three_turn_agent(client: Any, task: Any) -> dict:
    """Three chat calls that extend one another (append-only history); reward 1.0."""
    served = [m.id for m in (await client.models.list()).data]
    assert served == [task.model], served
    messages = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": f"Task with seed {task.seed}. Say something."},
    ]
    for turn in range(3):
        reply = await client.chat.completions.create(
            model=task.model,
            messages=messages,
            max_tokens=8,
            temperature=0.9,
            top_p=0.95,
            stop=["STOP"],
        )
        messages.append(
            {"role": "assistant", "content": reply.choices[0].message.content}
        )
        if turn < 2:
            messages.append({"role": "user", "content": f"Feedback {turn}: go on."})
    return {"reward": 1.0, "metrics": {"turns_played": 3.0}}


async def history_rewriting_agent(client: Any, task: Any) -> float:
    """Call 1; call 2 replaces call 1's reply by a summary (a rewrite: new segment); call 3 extends call 2."""
    system = {"role": "system", "content": "You are a test agent."}
    first = [system, {"role": "user", "content": "Start."}]
    reply = await client.chat.completions.create(
        model=task.model, messages=first, max_tokens=8
    )
    rewritten = [
        system,
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "(summary of my reply)"},
        {"role": "user", "content": "Continue."},
    ]
    reply = await client.chat.completions.create(
        model=task.model, messages=rewritten, max_tokens=8
    )
    extended = rewritten + [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "Finish."},
    ]
    await client.chat.completions.create(
        model=task.model, messages=extended, max_tokens=1000
    )  # capped by the config
    return 0.5


async def raising_agent(client: Any, task: Any) -> float:
    """One call, then the agent's own code fails."""
    await client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    raise RuntimeError("agent bug")


async def idling_agent(client: Any, task: Any) -> float:
    """One call, then the agent's own code hangs (longer than env_step_timeout_s)."""
    await client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    await asyncio.sleep(3600)
    return 0.0


async def unservable_requests_agent(client: Any, task: Any) -> dict:
    """Sends requests the endpoint cannot serve; returns how each was answered (status codes), then plays one call."""
    statuses: dict[str, float] = {}
    messages = [{"role": "user", "content": "Hi."}]
    attempts = {
        "tools": dict(
            model=task.model,
            messages=messages,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        ),
        "n2": dict(model=task.model, messages=messages, n=2),
        "wrong_model": dict(model="gpt-4o", messages=messages),
    }
    for name, kwargs in attempts.items():
        try:
            await client.chat.completions.create(**kwargs)
            statuses[name] = 200.0
        except openai.APIStatusError as exc:
            statuses[name] = float(exc.status_code)
    try:  # an endpoint that is not served
        await client.completions.create(model=task.model, prompt="Hi.")
        statuses["completions_endpoint"] = 200.0
    except openai.APIStatusError as exc:
        statuses["completions_endpoint"] = float(exc.status_code)
    await client.chat.completions.create(
        model=task.model, messages=messages, max_tokens=4
    )
    return {"reward": 0.0, "metrics": statuses}
