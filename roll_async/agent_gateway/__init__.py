"""Agent sessions: user agent code written against the OpenAI client, generated token-in/token-out.

``custom_envs.<Tag>.agent: pkg.module:function`` names ``async def agent(client,
task) -> float | dict``. For each episode the EnvManager opens an
:class:`~roll_async.agent_gateway.session.AgentSession` on its worker's
:class:`~roll_async.agent_gateway.server.AgentGateway` (an aiohttp server on the
loopback, one per EnvManagerWorker) and hands the function an
``openai.AsyncOpenAI`` client bound to that session's ``/v1`` base URL, plus an
:class:`~roll_async.agent_gateway.task.AgentTask`. See docs/architecture.md
"Agent sessions" for the token rules.
"""

from roll_async.agent_gateway.task import AgentTask, agent_result, load_agent_function

__all__ = ["AgentTask", "agent_result", "load_agent_function"]
