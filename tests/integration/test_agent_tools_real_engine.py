"""Function-calling agents on the real CPU engine, three zoo families with three tool-call formats.

Per family (qwen2_5: hermes ``<tool_call>``; llama3: a JSON object with ``parameters``; mistral:
``[TOOL_CALLS]`` + a JSON list), one in-process engine shared by the family's tests, and agents written
only against the real openai client: they declare a function tool, receive a parsed call, answer it with
a ``tool`` result (``function_call_output`` on the Responses API) and go on for 3 calls, through chat
completions, chat completions with ``stream: true``, and ``/v1/responses``.

A random-init model does not write tool calls, so the FIRST call of every episode is forced by a test
hook: the real engine runs on the real prompt, then the recording client replaces its output by the
family's tool-call text tokenized, plus the end-of-turn token (``TOOL_CALL_REPLIES``). The later calls
are the engine's own output (parsed too; a random reply is returned as content). Every check is on the
ids the engine received and the outputs handed back.
"""

from __future__ import annotations

import dataclasses

import pytest

from roll_async.agent_gateway.chat_request import render_form
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.model.families import FAMILIES, build_family_model
from roll_async.testing.agents import PARSED_CALL, TOOL_CALL_REPLIES, WEATHER_TOOL
from roll_async.trajectory import GenerationRequest, GenerationResult

pytestmark = [pytest.mark.integration]

pytest.importorskip("openai")

TOOL_FAMILIES = ("qwen2_5", "llama3", "mistral")
AGENTS = ("tool_agent", "streaming_tool_agent", "responses_tool_agent")


class ForcingRecorder:
    """The family's engine as an EngineClient: records every call; a first call's output is the forced tool call."""

    def __init__(self, engine, forced: list[int]) -> None:
        self.engine = engine
        self.forced = forced
        self.calls: list[tuple[GenerationRequest, GenerationResult]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.engine.generate(request)
        if "-t0-" in request.request_id and result.finish_reason != "abort":
            n = len(self.forced)
            result = dataclasses.replace(
                result,
                output_token_ids=list(self.forced),
                logprobs=[-1.0] * n,
                token_versions=[result.weight_version] * n,
                finish_reason="stop",
            )
        self.calls.append((request, result))
        return result

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)


@pytest.fixture(scope="module", params=TOOL_FAMILIES)
async def family(request):
    """(name, engine, tokenizer) with the engine started once, in this process."""
    from roll_async.engine.vllm_engine import VLLMEngine
    from roll_async.prompts.prompt_builder import load_tokenizer

    name = request.param
    path = str(build_family_model(name))
    engine = VLLMEngine(
        path,
        EngineConfig(
            dtype="float32",
            max_model_len=2048,
            max_num_seqs=4,
            cpu_kv_cache_space_gib=0.25,
        ),
    )
    await engine.start()
    try:
        yield name, engine, load_tokenizer(path)
    finally:
        await engine.shutdown()


def _config(agent: str) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=2048,
        rollout_batch_size=1,
        generation=GenerationConfig(temperature=1.0),
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent=f"roll_async.testing.agents:{agent}",
                max_steps=4,
                max_tokens_per_step=24,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Agent"]
        ),
        engine=EngineConfig(max_model_len=2048),
    )
    validate_config(config)
    return config


async def _episode(family, agent: str):
    from roll_async.scheduler.local import LocalRolloutScheduler

    name, engine, tokenizer = family
    eos = tokenizer.convert_tokens_to_ids(FAMILIES[name].eos_token)
    forced = tokenizer.encode(TOOL_CALL_REPLIES[name], add_special_tokens=False)
    client = ForcingRecorder(engine, forced + [eos])
    scheduler = LocalRolloutScheduler(
        rollout_spec(_config(agent), "train"), engines=client, tokenizer=tokenizer
    )
    try:
        batch, metrics = await scheduler.get_batch_with_metrics(0)
    finally:
        await scheduler.shutdown()
    (trajectory,) = batch
    calls = [
        (q, r)
        for q, r in client.calls
        if trajectory.traj_id in q.request_id and r.finish_reason != "abort"
    ]
    return trajectory, metrics, calls, scheduler.managers[0].prompts


@pytest.mark.parametrize("agent", AGENTS)
async def test_a_function_tool_agent_is_token_exact(family, agent):
    name = family[0]
    trajectory, metrics, calls, builder = await _episode(family, agent)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["tool_calls_seen"] >= 1.0, name  # the forced call parsed
    assert metrics["rollout/agent_segment_breaks"] == 0.0
    assert len(calls) == 3
    tools = builder.with_tools([WEATHER_TOOL])
    system_user = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    assert calls[0][0].prompt_token_ids == tools.render_ids(system_user, True)
    for k in (1, 2):
        (previous, previous_out), (request, _) = calls[k - 1], calls[k]
        head = previous.prompt_token_ids + previous_out.output_token_ids
        assert request.prompt_token_ids[: len(head)] == head, (
            f"{name} {agent}: call {k} does not extend call {k - 1}'s ids and outputs"
        )
    # after the forced call: closure + the template's delta for the tool result, nothing re-rendered
    first, first_out = calls[0]
    after = render_form(
        [{"role": "assistant", "content": "", "tool_calls": [PARSED_CALL]}]
    )[0]
    tool_message = {
        "role": "tool",
        "tool_call_id": PARSED_CALL["id"],
        "content": "sunny in Paris",
    }
    delta = tools.closure_ids_after(
        first_out.output_token_ids
    ) + tools.continuation_ids([tool_message], after)
    head = first.prompt_token_ids + first_out.output_token_ids
    assert calls[1][0].prompt_token_ids == head + delta
    last, last_out = calls[-1]
    assert trajectory.token_ids == last.prompt_token_ids + last_out.output_token_ids
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == sum((r.output_token_ids for _, r in calls), [])
    assert len(trajectory.token_versions) == len(trajectory.token_ids)
