"""Agent sessions: user agent code written against the OpenAI client (``custom_envs.<Tag>.agent: pkg.module:function``), served token-in/token-out by a loopback gateway per EnvManagerWorker (chat completions with function tools and streaming, and the Responses API), one session per episode; see docs/architecture.md "Agent sessions" for the token rules and what is served."""

from roll_async.agent_gateway.task import AgentTask, agent_result, load_agent_function

__all__ = ["AgentTask", "agent_result", "load_agent_function"]
