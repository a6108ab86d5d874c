"""An agent declaring a function tool, written only against the OpenAI client, playing the built-in FrozenLake env.

The model moves by calling ``move(direction)``; roll-async renders the tool
through the model's own chat template, parses the reply into ``tool_calls``
with vLLM's tool parser for the model's format, and keeps the episode
token-exact when the agent appends the reply as returned and answers each call
with a ``tool`` message. Use it as ``custom_envs.<Tag>.agent:
examples.agent_tool_calling:play_with_tools`` (with ``env_type: agent``) on a
model whose template renders tools, e.g. the zoo's Qwen2.5, Llama 3 or Mistral
(``roll-async make-tiny-model --family qwen2_5`` prints the ``model.path``).
A reply that is not a call is fed back as a reminder.
"""

from __future__ import annotations

import json

from roll_async.envs import make_env

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one cell on the lake.",
        "parameters": {
            "type": "object",
            "properties": {
                "direction": {"type": "string", "enum": ["Up", "Down", "Left", "Right"]}
            },
            "required": ["direction"],
        },
    },
}


async def play_with_tools(client, task) -> dict:
    env = make_env("frozen_lake", task.env_config)
    observation, info = env.reset(task.seed)
    messages = [
        {"role": "system", "content": "Reach the goal. Move with the move tool."},
        {"role": "user", "content": f"{info['instruction']}\n{observation}"},
    ]
    total, success, done = 0.0, False, False
    for _ in range(task.max_steps):
        reply = await client.chat.completions.create(
            model=task.model,
            messages=messages,
            tools=[MOVE],
            max_tokens=task.max_tokens,
        )
        message = reply.choices[0].message
        echoed = {
            "role": "assistant",
            "content": message.content,
        }  # exactly as returned
        if message.tool_calls:
            echoed["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        messages.append(echoed)
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Call the move tool."})
            continue
        for call in message.tool_calls:
            direction = json.loads(call.function.arguments).get("direction", "")
            observation, reward, terminated, truncated, info = env.step(
                f"<answer>{direction}</answer>"
            )
            total += reward
            success = bool(info["metrics"]["success"])
            done = terminated or truncated
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": observation}
            )
            if done:
                break
        if done:
            break
    return {"reward": total, "metrics": {"success": float(success)}}
