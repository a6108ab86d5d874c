"""Agents written against the OpenAI client that work in a swe task's shell through ``task.workspace``.

With ``env_type: swe`` and ``agent: examples.agent_swe:<function>`` (configs/agent_swe.yaml) roll-async
starts the task's workspace (the ``runtime`` of ``env_config``: the namespace sandbox or Docker) before
calling the agent, serves its chat calls token-exact, and when it returns scores the workspace with the
task's hidden tests: that is the episode's reward, whatever the agent returns.

``play_in_shell`` is mini-swe-agent's loop spelled out: one fenced bash block per reply, run with
``await task.workspace.aexecute(command)``, its output the next user message, until the reply runs
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (or has no block). ``play_mini_swe_agent`` runs
mini-swe-agent's own ``DefaultAgent`` unmodified (``pip install mini-swe-agent``), with the handle as its
environment and its ``LitellmTextbasedModel`` pointed at the episode's endpoint; a synchronous harness
runs in a thread (``asyncio.to_thread``), where the handle's blocking ``execute`` belongs.
"""

from __future__ import annotations

import asyncio
import os
import re

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SYSTEM = (
    "You are a careful software engineer working in a Linux shell. Reply with a short thought and "
    "exactly one bash command in a ```bash fenced block. When the task is done, run "
    f"`echo {SUBMIT}` alone."
)
FENCE = re.compile(r"```(?:bash|sh)?[ \t]*\n(.*?)```", re.DOTALL)


async def play_in_shell(client, task) -> dict:
    workspace = task.workspace
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": workspace.instruction},
    ]
    commands = 0
    for _ in range(task.max_steps):
        reply = await client.chat.completions.create(
            model=task.model, messages=messages, max_tokens=task.max_tokens
        )
        content = reply.choices[0].message.content or ""
        messages.append(
            {"role": "assistant", "content": content}
        )  # exactly as returned
        blocks = FENCE.findall(content)
        if not blocks:
            break
        result = await workspace.aexecute(blocks[0])
        commands += 1
        if result["returncode"] == 0 and result["output"].lstrip().startswith(SUBMIT):
            break
        note = (
            f"<exception>{result['exception_info']}</exception>\n"
            if result["exception_info"]
            else ""
        )
        messages.append(
            {
                "role": "user",
                "content": f"{note}<returncode>{result['returncode']}</returncode>\n<output>\n{result['output']}</output>",
            }
        )
    # the reward is the hidden tests'; an agent's own claim would be ignored, so it only reports metrics
    return {"reward": 0.0, "metrics": {"shell_commands": float(commands)}}


async def play_mini_swe_agent(client, task) -> dict:
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # no banner per episode
    # litellm: the model prices it ships, no download on import
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # a call the endpoint refuses (a limit, an ended episode) is final, and roll-async already retries the
    # engine: one attempt, so a harness thread that outlived its episode ends at once instead of backing off
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    # mini-swe-agent's own text-based setup: its prompts, observation template and format errors
    settings = yaml.safe_load((builtin_config_dir / "mini_textbased.yaml").read_text())
    model_settings = settings["model"]
    model = LitellmTextbasedModel(
        **{
            **model_settings,
            "model_name": f"openai/{task.model}",  # litellm's OpenAI-compatible route
            "model_kwargs": {
                **model_settings.get("model_kwargs", {}),
                "api_base": str(client.base_url),
                "api_key": client.api_key,
                "max_tokens": task.max_tokens,
            },
            "cost_tracking": "ignore_errors",  # a local model has no price
        }
    )
    agent_settings = {
        **settings["agent"],
        "step_limit": task.max_steps,
        "cost_limit": 0,
    }
    agent = DefaultAgent(model, task.workspace, **agent_settings)
    result = await asyncio.to_thread(agent.run, task.workspace.instruction)
    return {"metrics": {"submitted": float(result.get("exit_status") == "Submitted")}}
