"""Agents written only against the openai client, for agent-session tests (configs name them by path)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from roll_async.agent_gateway.task import AgentTask


async def three_turn_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
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


async def history_rewriting_agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
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


async def overrunning_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """Append-only calls until the endpoint refuses one over ``sequence_length``. ``task.env_config``: ``catch``
    returns a reward (0.5) and metrics after the refusal; ``recover`` then makes one more call with a short
    history (a summary: a new segment); neither lets the refusal's error propagate, as frameworks do."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Talk."}]
    for _ in range(task.max_steps):
        try:
            reply = await client.chat.completions.create(
                model=task.model, messages=messages, max_tokens=task.max_tokens
            )
        except openai.BadRequestError as exc:
            if not task.env_config.get("catch"):
                raise
            code = (exc.body or {}).get("code")
            if task.env_config.get("recover"):
                summary = [{"role": "user", "content": "Summary: we talked."}]
                await client.chat.completions.create(
                    model=task.model, messages=summary, max_tokens=task.max_tokens
                )
            return {
                "reward": 0.5,
                "metrics": {
                    "refused_for_length": float(code == "context_length_exceeded")
                },
            }
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "More."},
        ]
    return {"reward": 1.0, "metrics": {"refused_for_length": 0.0}}


async def raising_agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
    """One call, then the agent's own code fails."""
    await client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    raise RuntimeError("agent bug")


async def idling_agent(client: openai.AsyncOpenAI, task: AgentTask) -> float:
    """One call, then the agent's own code hangs (longer than env_step_timeout_s)."""
    await client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
    )
    await asyncio.sleep(3600)
    return 0.0


async def unservable_requests_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """Sends requests the endpoint cannot serve; returns how each was answered (status codes), then plays one call."""
    statuses: dict[str, float] = {}
    messages = [{"role": "user", "content": "Hi."}]
    attempts: dict[str, dict[str, Any]] = {
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


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


#: A tool call as each family's model writes it (its template's call format), then the turn's end token.
TOOL_CALL_REPLIES = {
    "qwen2_5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
}
#: The call every TOOL_CALL_REPLIES text parses to (the first call of an episode: id ``call00000``).
PARSED_CALL = {
    "id": "call00000",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def _assistant_message(message: Any) -> dict[str, Any]:
    """A returned assistant message as the agent echoes it (what ``message.model_dump()`` carries)."""
    echoed: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        echoed["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return echoed


async def _chat(client: Any, stream: bool, **kwargs: Any) -> Any:
    """One chat call; with ``stream`` the chunks are put back together into a message."""
    if not stream:
        return (await client.chat.completions.create(**kwargs)).choices[0]
    content, usage_chunks = "", 0
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    async for chunk in await client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    ):
        if not chunk.choices:  # the include_usage chunk, after the finish reason
            assert finish is not None and chunk.usage.completion_tokens >= 0
            usage_chunks += 1
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(
                call.index,
                {
                    "id": "",
                    "type": "function",
                    "function": {"name": "", "arguments": ""},
                },
            )
            entry["id"] = call.id or entry["id"]
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
    assert usage_chunks == 1, usage_chunks
    message = openai.types.chat.ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [calls[i] for i in sorted(calls)] or None,
        }
    )
    return openai.types.chat.chat_completion.Choice(
        index=0, message=message, finish_reason=finish
    )


def _reserialised(message: dict[str, Any], city: str | None) -> dict[str, Any]:
    """An echoed reply with its arguments written back compactly, as pydantic-ai does (``{"city":"Paris"}``);
    ``city`` replaces the argument (a genuine rewrite of the call)."""
    calls = []
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        arguments["city"] = city or arguments["city"]
        compact = json.dumps(arguments, separators=(",", ":"))
        calls.append({**call, "function": {**call["function"], "arguments": compact}})
    return {**message, "tool_calls": calls} if calls else message


async def _tool_agent(
    client: openai.AsyncOpenAI, task: AgentTask, stream: bool, reserialise: bool = False
) -> dict[str, Any]:
    """Three calls with a function tool: every tool call gets a ``tool`` result, a plain reply a user turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    calls = 0
    for turn in range(3):
        choice = await _chat(
            client,
            stream,
            model=task.model,
            messages=messages,
            tools=[WEATHER_TOOL],
            max_tokens=64,
        )
        echoed = _assistant_message(choice.message)
        if reserialise:
            echoed = _reserialised(echoed, task.env_config.get("rewrite_city"))
        messages.append(echoed)
        for call in choice.message.tool_calls or []:
            calls += 1
            assert choice.finish_reason == "tool_calls"
            city = json.loads(call.function.arguments)["city"]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"}
            )
        if not choice.message.tool_calls and turn < 2:
            messages.append({"role": "user", "content": f"Go on ({turn})."})
    return {"reward": 1.0, "metrics": {"tool_calls_seen": float(calls)}}


async def tool_agent(client: openai.AsyncOpenAI, task: AgentTask) -> dict[str, Any]:
    """Three chat calls declaring a function tool; tool calls answered with tool results."""
    return await _tool_agent(client, task, stream=False)


async def reserialising_tool_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """:func:`tool_agent` echoing its tool calls with compact arguments (``task.env_config["rewrite_city"]``:
    with that city instead, a rewrite)."""
    return await _tool_agent(client, task, stream=False, reserialise=True)


async def streaming_tool_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """:func:`tool_agent` with ``stream=True`` (chunks put back together)."""
    return await _tool_agent(client, task, stream=True)


async def responses_tool_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """:func:`tool_agent` through the Responses API: function_call items answered with function_call_output.

    Sent as the OpenAI Agents SDK's OpenAIResponsesModel sends it: a strict function tool (same schema as
    the chat agent's, so both render the same prompt), ``include``,
    ``truncation``, ``metadata``, ``store=False``, the previous output items echoed with their ids.
    """
    function = WEATHER_TOOL["function"]
    tool = {
        "type": "function",
        "name": function["name"],
        "description": function["description"],
        "parameters": function["parameters"],
        "strict": True,
    }
    items: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    calls = 0
    for turn in range(3):
        response = await client.responses.create(
            model=task.model,
            instructions="You are a test agent.",
            input=items,
            tools=[tool],
            max_output_tokens=64,
            store=False,
            include=[],
            truncation="disabled",
            metadata={},
        )
        items += [item.model_dump(exclude_none=True) for item in response.output]
        called = [item for item in response.output if item.type == "function_call"]
        for item in called:
            calls += 1
            city = json.loads(item.arguments)["city"]
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": item.call_id,
                    "output": f"sunny in {city}",
                }
            )
        if not called and turn < 2:
            items.append({"role": "user", "content": f"Go on ({turn})."})
    return {"reward": 1.0, "metrics": {"tool_calls_seen": float(calls)}}


async def tool_choice_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """One call with tool_choice=required; returns whether a call came back."""
    reply = await client.chat.completions.create(
        model=task.model,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=16,
    )
    got = reply.choices[0]
    return {
        "reward": 0.0,
        "metrics": {
            "got_calls": float(bool(got.message.tool_calls)),
            "finish_stop": float(got.finish_reason == "stop"),
        },
    }


async def bad_tool_requests_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """Requests the endpoint must refuse with a 400 naming the parameter; returns status + param per case."""
    messages = [{"role": "user", "content": "Hi."}]
    call = {
        "id": "call_x",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    attempts: dict[str, dict[str, Any]] = {
        "bad_schema": dict(
            messages=messages,
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "objekt"}},
                }
            ],
        ),
        "unknown_tool_call_id": dict(
            messages=messages
            + [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_other", "content": "x"},
            ],
            tools=[WEATHER_TOOL],
        ),
        "penalty": dict(messages=messages, presence_penalty=0.5),
        "logit_bias": dict(messages=messages, logit_bias={"5": 1.0}),
        "n2": dict(messages=messages, n=2),
        "structured": dict(
            messages=messages,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
        ),
        "named_unknown": dict(
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        ),
    }
    metrics: dict[str, float] = {}
    params: dict[str, str] = {}
    for name, kwargs in attempts.items():
        try:
            await client.chat.completions.create(model=task.model, **kwargs)
            metrics[name] = 200.0
        except openai.APIStatusError as exc:
            metrics[name] = float(exc.status_code)
            params[name] = str((exc.body or {}).get("param"))
    try:
        await client.responses.create(
            model=task.model, input="Hi.", previous_response_id="resp_1"
        )
        metrics["previous_response_id"] = 200.0
    except openai.APIStatusError as exc:
        metrics["previous_response_id"] = float(exc.status_code)
        params["previous_response_id"] = str((exc.body or {}).get("param"))
    await client.chat.completions.create(
        model=task.model, messages=messages, max_tokens=4
    )
    for (
        name,
        param,
    ) in (
        params.items()
    ):  # the parameter each error named, as a 0/1 flag per expected name
        metrics[f"param_{name}_{param}"] = 1.0
    return {"reward": 0.0, "metrics": metrics}


async def streaming_responses_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """One streamed Responses call with a function tool; returns what the event stream held."""
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    kinds: list[str] = []
    final = None
    async with client.responses.stream(
        model=task.model, input="Weather in Paris?", tools=[tool], max_output_tokens=64
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    return {
        "reward": 0.0,
        "metrics": {
            "created_first": float(kinds[0] == "response.created"),
            "completed_last": float(kinds[-1] == "response.completed"),
            "calls": float(len(calls)),
            "paris": float(
                bool(calls) and json.loads(calls[0].arguments) == {"city": "Paris"}
            ),
        },
    }


async def tool_choice_variants_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """tool_choice none (tools declared, nothing parsed) then a named function (met)."""
    messages = [{"role": "user", "content": "Weather?"}]
    none = await client.chat.completions.create(
        model=task.model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=64,
    )
    named = await client.chat.completions.create(
        model=task.model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    return {
        "reward": 0.0,
        "metrics": {
            "none_calls": float(bool(none.choices[0].message.tool_calls)),
            "none_has_text": float(
                "get_weather" in (none.choices[0].message.content or "")
            ),
            "named_calls": float(len(named.choices[0].message.tool_calls or [])),
        },
    }


async def _agents_sdk_agent(
    client: openai.AsyncOpenAI, task: AgentTask, model_class: str
) -> dict[str, Any]:
    """A real OpenAI Agents SDK ``Agent`` with one ``@function_tool``, run by ``Runner.run`` (tracing off).

    ``task.env_config``: ``model_settings`` adds ``agents.ModelSettings`` fields (what the SDK then sends;
    ``reasoning`` as a dict), ``auto_previous_response_id`` runs with server-side state (a refused request
    ends the run: its status and the parameter it named are returned as metrics).
    """
    import agents  # the OpenAI Agents SDK (openai-agents), imported only by these agents
    from openai.types.shared import Reasoning

    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool  # type: ignore[untyped-decorator]  # agents is not followed (pyproject [tool.mypy])
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    settings = dict(task.env_config.get("model_settings", {}))
    if isinstance(settings.get("reasoning"), dict):
        settings["reasoning"] = Reasoning(**settings["reasoning"])
    run_config = None
    if model_class == "chat":
        model: Any = agents.OpenAIChatCompletionsModel(
            model=task.model, openai_client=client
        )
        served_by = model
    else:  # a model name through the SDK's default provider: its default OpenAIResponsesModel
        model = task.model
        provider = agents.OpenAIProvider(openai_client=client)
        run_config = agents.RunConfig(model_provider=provider)
        served_by = provider.get_model(task.model)
    agent = agents.Agent(
        name="weather",
        instructions="You are a test agent.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(max_tokens=64, **settings),
    )
    metrics = {
        "tool_ran_for_paris": 0.0,
        "finished_sunny": 0.0,
        f"model_class_{type(served_by).__name__}": 1.0,
    }
    try:
        result = await agents.Runner.run(
            agent,
            "What is the weather in Paris?",
            max_turns=3,
            run_config=run_config,
            auto_previous_response_id=bool(
                task.env_config.get("auto_previous_response_id")
            ),
        )
    except openai.APIStatusError as exc:
        metrics["refused_status"] = float(exc.status_code)
        metrics[f"refused_param_{(exc.body or {}).get('param')}"] = 1.0
        return {"reward": 0.0, "metrics": metrics}
    metrics["tool_ran_for_paris"] = float(cities == ["Paris"])
    metrics["finished_sunny"] = float(result.final_output == "sunny")
    metrics["model_calls"] = float(len(result.raw_responses))
    return {"reward": 1.0, "metrics": metrics}


async def agents_sdk_chat_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """The Agents SDK on ``OpenAIChatCompletionsModel`` over the session's client."""
    return await _agents_sdk_agent(client, task, "chat")


async def agents_sdk_responses_agent(
    client: openai.AsyncOpenAI, task: AgentTask
) -> dict[str, Any]:
    """The Agents SDK on its default model class (``OpenAIResponsesModel``) over the session's client."""
    return await _agents_sdk_agent(client, task, "responses")
