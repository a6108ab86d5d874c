"""FrozenLake played by agents written with agent frameworks, each moving through one ``move`` tool.

The same game as ``agent_tool_calling.py``, written four ways: the OpenAI Agents SDK, pydantic-ai,
LangGraph (``create_react_agent`` on langchain-openai's ``ChatOpenAI``) and smolagents
(``ToolCallingAgent`` on ``OpenAIServerModel``). Each framework keeps its own message history and sends it
back its own way (pydantic-ai re-serialises tool-call arguments, smolagents echoes calls as text); the
endpoint matches such echoes by meaning, so every episode stays one token-exact trajectory. Frameworks
that take a client get the episode's ``openai.AsyncOpenAI``; those that take a URL get
``base_url=str(client.base_url)`` and ``api_key=client.api_key``. The reward is the env's. Install the
frameworks with ``pip install 'roll-async[agents]'``; use a model whose template renders tools (the
zoo's ``tiny-qwen2_5``). Config: ``configs/agent_frameworks.yaml``.
"""

from __future__ import annotations

import asyncio

from roll_async.envs import make_env

INSTRUCTIONS = (
    "Reach the goal on the frozen lake. Move with the move tool, one cell per call."
)


class Lake:
    """One episode's FrozenLake, stepped by the ``move`` tool of whichever framework plays it."""

    def __init__(self, task):
        self.env = make_env("frozen_lake", task.env_config)
        observation, info = self.env.reset(task.seed)
        self.prompt = f"{info['instruction']}\n{observation}"
        self.reward, self.success, self.done = 0.0, False, False

    def move(self, direction: str) -> str:
        """Move one cell on the lake: Up, Down, Left or Right."""
        if self.done:
            return "The episode is over."
        observation, reward, terminated, truncated, info = self.env.step(
            f"<answer>{direction}</answer>"
        )
        self.reward += reward
        self.success = bool(info["metrics"]["success"])
        self.done = terminated or truncated
        return observation

    def result(self) -> dict:
        return {"reward": self.reward, "metrics": {"success": float(self.success)}}


async def play_agents_sdk(client, task) -> dict:
    """The OpenAI Agents SDK: an ``Agent`` with a ``@function_tool`` on the episode's client (tracing off)."""
    import agents

    lake = Lake(task)
    agents.set_tracing_disabled(True)
    move = agents.function_tool(lake.move)
    model = agents.OpenAIChatCompletionsModel(model=task.model, openai_client=client)
    agent = agents.Agent(
        name="lake",
        instructions=INSTRUCTIONS,
        tools=[move],
        model=model,
        model_settings=agents.ModelSettings(max_tokens=task.max_tokens),
    )
    try:
        await agents.Runner.run(agent, lake.prompt, max_turns=task.max_steps)
    except agents.MaxTurnsExceeded:
        pass  # out of moves: the reward so far stands
    return lake.result()


async def play_pydantic_ai(client, task) -> dict:
    """pydantic-ai: an ``Agent`` on ``OpenAIChatModel`` with the episode's client as its provider."""
    from pydantic_ai import Agent, UsageLimitExceeded, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    lake = Lake(task)
    model = OpenAIChatModel(task.model, provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model, instructions=INSTRUCTIONS, model_settings={"max_tokens": task.max_tokens}
    )
    agent.tool_plain(lake.move)
    try:
        await agent.run(
            lake.prompt, usage_limits=UsageLimits(request_limit=task.max_steps)
        )
    except UsageLimitExceeded:
        pass
    return lake.result()


async def play_langgraph(client, task) -> dict:
    """LangGraph: ``create_react_agent`` on ``ChatOpenAI``, which takes the endpoint's URL and key."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    lake = Lake(task)
    llm = ChatOpenAI(
        model=task.model,
        base_url=str(client.base_url),
        api_key=client.api_key,
        max_retries=0,
        max_completion_tokens=task.max_tokens,
    )
    graph = create_react_agent(llm, [tool(lake.move)], prompt=INSTRUCTIONS)
    try:
        await graph.ainvoke(
            {"messages": [("user", lake.prompt)]},
            {"recursion_limit": 2 * task.max_steps},
        )
    except GraphRecursionError:
        pass
    return lake.result()


async def play_smolagents(client, task) -> dict:
    """smolagents: a ``ToolCallingAgent`` on ``OpenAIServerModel`` (synchronous, so it runs in a thread)."""
    from smolagents import LogLevel, OpenAIServerModel, Tool, ToolCallingAgent

    lake = Lake(task)

    class Move(Tool):
        name = "move"
        description = "Move one cell on the lake."
        inputs = {
            "direction": {"type": "string", "description": "Up, Down, Left or Right"}
        }
        output_type = "string"

        def forward(self, direction: str) -> str:
            return lake.move(direction)

    model = OpenAIServerModel(
        task.model,
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"max_retries": 0},
        max_tokens=task.max_tokens,
    )
    agent = ToolCallingAgent(
        tools=[Move()],
        model=model,
        max_steps=task.max_steps,
        verbosity_level=LogLevel.OFF,
    )
    agent.prompt_templates["system_prompt"] = (
        INSTRUCTIONS + " Give your answer with the final_answer tool."
    )
    await asyncio.to_thread(agent.run, lake.prompt)
    return lake.result()
