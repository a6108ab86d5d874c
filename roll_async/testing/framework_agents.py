"""Agents built on third-party agent frameworks (pydantic-ai, LangGraph, smolagents), for the agent-session tests.

Each framework keeps its own history and re-serialises what the endpoint returned before sending it back
(pydantic-ai writes tool-call arguments compactly, smolagents writes calls as text), so these agents are how
the tests show that such episodes still train as one token-exact trajectory. Each declares the same
``get_weather(city)`` tool as :data:`roll_async.testing.agents.WEATHER_TOOL` and finishes on the model's
plain reply (smolagents: on its ``final_answer`` tool). The frameworks are the ``agents`` extra, imported
inside each agent so this module imports without them.

How a framework that takes a base URL rather than a client connects: ``base_url=str(client.base_url)``
and ``api_key=client.api_key`` of the ``openai.AsyncOpenAI`` client the episode is given.
"""

from __future__ import annotations

import asyncio
import importlib.resources
from typing import Any

import openai
import yaml

from roll_async.agent_gateway.task import AgentTask

__all__ = ["langgraph_agent", "pydantic_ai_agent", "smolagents_agent"]

QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = "You are a test agent."
#: smolagents' own system prompt (examples of notional tools) is ~3k ids on the tiny models' 1024-id
#: tokenizers, over the real-engine test's max_model_len; its other templates are kept.
SMOLAGENTS_SYSTEM_PROMPT = (
    "You are a test agent. Use the tools; give your answer with the final_answer tool."
)


def _result(cities: list[str], answer: object, calls: int) -> dict[str, Any]:
    """The reward and metrics every framework agent returns: did the tool run for Paris, was the answer sunny."""
    return {
        "reward": 1.0,
        "metrics": {
            "tool_ran_for_paris": float(cities == ["Paris"]),
            "finished_sunny": float(str(answer).strip() == "sunny"),
            "model_calls": float(calls),
        },
    }


async def pydantic_ai_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """A pydantic-ai ``Agent`` on ``OpenAIChatModel`` with the session's client (``OpenAIProvider(openai_client=)``)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    cities: list[str] = []
    model = OpenAIChatModel(task.model, provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model, instructions=INSTRUCTIONS, model_settings={"max_tokens": task.max_tokens}
    )

    @agent.tool_plain  # type: ignore[untyped-decorator]  # pydantic_ai is not followed (pyproject [tool.mypy])
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    result = await agent.run(QUESTION)
    responses = sum(1 for m in result.all_messages() if m.kind == "response")
    return _result(cities, result.output, responses)


async def langgraph_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """LangGraph's ``create_react_agent`` on langchain-openai's ``ChatOpenAI``, given the base URL and key."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    cities: list[str] = []

    @tool  # type: ignore[untyped-decorator]  # langchain_core is not followed (pyproject [tool.mypy])
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    llm = ChatOpenAI(
        model=task.model,
        base_url=str(client.base_url),
        api_key=client.api_key,
        max_retries=0,
        max_completion_tokens=task.max_tokens,
    )
    graph = create_react_agent(llm, [get_weather], prompt=INSTRUCTIONS)
    state = await graph.ainvoke(
        {"messages": [("user", QUESTION)]}, {"recursion_limit": 8}
    )
    replies = [m for m in state["messages"] if m.type == "ai"]
    return _result(cities, replies[-1].content, len(replies))


async def smolagents_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """A smolagents ``ToolCallingAgent`` on ``OpenAIServerModel`` (given the base URL and key).

    smolagents is synchronous (its model holds an ``openai.OpenAI`` client), so the run goes to a thread: a
    blocking call on the worker's event loop would stall the endpoint that serves it. It sends
    ``tool_choice: required`` and its own stop strings, and echoes a tool-call turn as text
    (``Calling tools:`` + the calls) followed by a user ``Observation:`` message.
    """
    from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool

    cities: list[str] = []

    @tool  # type: ignore[untyped-decorator]
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city.
        """
        cities.append(city)
        return f"sunny in {city}"

    model = OpenAIServerModel(
        task.model,
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"max_retries": 0},
        max_tokens=task.max_tokens,
    )
    templates = yaml.safe_load(
        importlib.resources.files("smolagents.prompts")
        .joinpath("toolcalling_agent.yaml")
        .read_text()
    )
    templates["system_prompt"] = SMOLAGENTS_SYSTEM_PROMPT
    agent = ToolCallingAgent(
        tools=[get_weather],
        model=model,
        max_steps=3,
        verbosity_level=LogLevel.OFF,
        prompt_templates=templates,
    )
    answer = await asyncio.to_thread(agent.run, QUESTION)
    steps = sum(1 for s in agent.memory.steps if type(s).__name__ == "ActionStep")
    return _result(cities, answer, steps)
