"""Every zoo family end to end on the real CPU engine: a 3-turn env through rollout and one training step.

Per family (one engine, started once and shared by the family's tests):
- token-in/token-out: each request's prompt is the trajectory so far, generated ids are kept as returned;
- engine vs trainer logprobs on the generated tokens agree within LOGPROB_TOLERANCE at T=1 and at
  T=0.7/top_p=0.9 (the trainer scores under the same transformation);
- rollout/prefix_mismatch_rate is 0 for append-only templates and 1 for Qwen3's think stripping;
- one GRPO step, then a weight sync in each pause mode (abort, wait, keep) with a request in flight on
  the probe prompt: the engine's greedy output changes and its logprobs on the (prefix-cached) probe
  prompt equal the updated trainer's, so no prefix computed under old weights was reused;
- for the three families with three tool-call formats (qwen2_5: hermes ``<tool_call>``; llama3: a JSON
  object with ``parameters``; mistral: ``[TOOL_CALLS]`` + a JSON list), function-tool agents written
  only against the real openai client, on the same engine: they declare a function tool, receive a
  parsed call, answer it with a ``tool`` result (``function_call_output`` on the Responses API) and go
  on for 3 calls, through chat completions, chat completions with ``stream: true``, and
  ``/v1/responses``, token-exact. A random-init model does not write tool calls, so the FIRST call of
  every episode is forced by a test hook: the real engine runs on the real prompt, then the recording
  client replaces its output by the family's tool-call text tokenized, plus the end-of-turn token
  (``TOOL_CALL_REPLIES``). The later calls are the engine's own output (parsed too; a random reply is
  returned as content). Every check is on the ids the engine received and the outputs handed back;
- on the qwen2_5 engine, one tool episode per agent framework (OpenAI Agents SDK, pydantic-ai, LangGraph,
  smolagents; both calls forced), each one token-exact segment although the frameworks re-serialise the
  tool-call turn they send back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid

import pytest

from roll_async.agent_gateway.chat_request import render_form
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    TrainerConfig,
    validate_config,
)
from roll_async.model.families import FAMILIES, build_family_model
from roll_async.testing.agents import PARSED_CALL, TOOL_CALL_REPLIES, WEATHER_TOOL
from roll_async.trajectory import GenerationRequest, GenerationResult

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Largest |engine - trainer| logprob on any generated token (both float32 on CPU; kernels differ in
#: summation order). Measured per family in benchmarks/results/model_families.md.
LOGPROB_TOLERANCE = 1e-3
APPEND_ONLY_FAMILIES = {
    "qwen2_5",
    "phi3",
}  # no rewrite, no trimming of replies: a fresh render is identical
THINK_STRIPPING_FAMILIES = {"qwen3", "qwen3_moe"}
SOKOBAN = {"dim_room": [6, 6], "num_boxes": 1}


class RecordingClient:
    """The family's in-process engine as an EngineClient that keeps every request and result."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[GenerationRequest, GenerationResult]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = self.rewrite(request, await self.engine.generate(request))
        self.calls.append((request, result))
        return result

    def rewrite(
        self, request: GenerationRequest, result: GenerationResult
    ) -> GenerationResult:
        """What the caller gets instead of the engine's result (and what is recorded): the result itself."""
        return result

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
async def family(request):
    """(name, model path, engine, trainer, tokenizer) for one family; the engine starts once, in this process
    (no Ray actor: one process less to start on a loaded machine)."""
    from roll_async.engine.vllm_engine import VLLMEngine
    from roll_async.prompts.tokenizers import load_tokenizer
    from roll_async.trainer.grpo_trainer import GRPOTrainer

    name = request.param
    path = str(build_family_model(name))
    engine = VLLMEngine(
        path,
        EngineConfig(
            dtype="float32",
            max_model_len=2048,  # the tool agents' episodes
            max_num_seqs=16,
            cpu_kv_cache_space_gib=0.25,
        ),
    )
    await engine.start()
    tokenizer = load_tokenizer(path)
    trainer = GRPOTrainer(
        TrainerConfig(device="cpu", dtype="float32", lr=1e-3, micro_batch_size=4),
        path,
        tokenizer=tokenizer,
    )
    try:
        yield name, path, engine, trainer, tokenizer
    finally:
        await engine.shutdown()


def _config(generation: GenerationConfig) -> PipelineConfig:
    from roll_async.config.schema import validate_config

    config = PipelineConfig(
        custom_envs={
            "Sokoban": CustomEnvConfig(
                env_type="sokoban",
                env_config=SOKOBAN,
                max_steps=3,
                max_tokens_per_step=16,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["Sokoban"]
        ),
        engine=EngineConfig(max_model_len=1024),
        generation=generation,
        mode="sync",
        rollout_batch_size=2,
        sequence_length=768,
    )
    validate_config(config)
    return config


async def _rollout(family, generation: GenerationConfig):
    from roll_async.scheduler.local import LocalRolloutScheduler

    _, _, engine, _, tokenizer = family
    client = RecordingClient(engine)
    scheduler = LocalRolloutScheduler(
        rollout_spec(_config(generation), "train"), engines=client, tokenizer=tokenizer
    )
    try:
        batch, metrics = await scheduler.get_batch_with_metrics(0)
    finally:
        await scheduler.shutdown()
    return batch, metrics, client.calls


def _assert_token_in_token_out(batch, calls) -> None:
    for trajectory in batch:
        mine = [
            (q, r)
            for q, r in calls
            if q.request_id.split("-env")[0].endswith(trajectory.traj_id)
            and f"-env{trajectory.env_id}-" in q.request_id
        ]
        assert len(mine) == trajectory.num_turns >= 1
        ids = trajectory.token_ids
        for k, (request, result) in enumerate(mine):
            prompt = request.prompt_token_ids
            assert ids[: len(prompt)] == prompt, (
                f"turn {k}: the prompt is not the trajectory so far"
            )
            out = slice(len(prompt), len(prompt) + len(result.output_token_ids))
            assert ids[out] == result.output_token_ids, (
                f"turn {k}: generated ids were altered"
            )
            assert trajectory.response_mask[out] == [1] * len(result.output_token_ids)
        assert sum(trajectory.response_mask) == sum(
            len(r.output_token_ids) for _, r in mine
        )


def _logprob_gap(
    trainer, batch, generation: GenerationConfig, pad_token_id: int
) -> float:
    from roll_async.sampling import SamplingSettings
    from roll_async.trainer.collate import collate_trajectories

    collated = collate_trajectories(
        batch,
        pad_token_id=pad_token_id,
        sampling=SamplingSettings.from_generation(generation),
    )
    scored = trainer.compute_logprobs(collated)
    mask = collated.response_mask.bool()
    return float((scored[mask] - collated.old_logprobs[mask]).abs().max())


def _pad(tokenizer) -> int:
    return (
        tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id
    )


async def test_three_turn_rollout_is_token_exact_and_trains_one_step(family):
    from roll_async.metrics import PREFIX_MISMATCH_RATE
    from roll_async.sampling import SamplingSettings
    from roll_async.trainer.collate import collate_trajectories

    name, _, engine, trainer, tokenizer = family
    generation = GenerationConfig(temperature=1.0)
    batch, metrics, calls = await _rollout(family, generation)
    _assert_token_in_token_out(batch, calls)
    assert max(t.num_turns for t in batch) == 3
    if name in APPEND_ONLY_FAMILIES:
        assert metrics[PREFIX_MISMATCH_RATE] == 0.0
    if name in THINK_STRIPPING_FAMILIES:
        # the last reply gains an empty <think> block in a fresh render
        assert metrics[PREFIX_MISMATCH_RATE] == 1.0
    assert (
        _logprob_gap(trainer, batch, generation, _pad(tokenizer)) <= LOGPROB_TOLERANCE
    )

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    for t in batch:  # distinct rewards so GRPO advantages are non-zero
        t.episode_reward = float(t.episode_id % 2)
    collated = collate_trajectories(
        batch,
        pad_token_id=_pad(tokenizer),
        sampling=SamplingSettings.from_generation(generation),
    )
    train_metrics = trainer.train_step(collated, 0)
    assert train_metrics["train/importance_ratio/max"] == pytest.approx(1.0, abs=1e-2)
    assert any(not p.equal(before[n]) for n, p in trainer.model.named_parameters())
    await engine.update_weights(trainer.state_dict_for_engine(), 1)
    batch, _, _ = await _rollout(family, generation)
    assert (
        _logprob_gap(trainer, batch, generation, _pad(tokenizer)) <= LOGPROB_TOLERANCE
    )  # the engine has the new weights


async def test_logprobs_agree_at_temperature_0_7_top_p_0_9(family):
    name, _, _, trainer, tokenizer = family
    generation = GenerationConfig(temperature=0.7, top_p=0.9)
    batch, _, calls = await _rollout(family, generation)
    _assert_token_in_token_out(batch, calls)
    assert (
        _logprob_gap(trainer, batch, generation, _pad(tokenizer)) <= LOGPROB_TOLERANCE
    )


async def _greedy(engine, prompt: list[int], tokens: int = 12) -> GenerationResult:
    return await engine.generate(
        GenerationRequest(
            request_id=f"probe-{uuid.uuid4().hex[:8]}",
            prompt_token_ids=prompt,
            max_tokens=tokens,
            temperature=0.0,
            ignore_eos=True,
        )
    )


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
async def test_weight_sync_in_each_pause_mode_changes_outputs_without_stale_prefixes(
    family, mode
):
    from roll_async.model.check import perturb_weights
    from roll_async.prompts.prompt_builder import ChatPromptBuilder
    from roll_async.trainer import score_generated_tokens

    name, _, engine, trainer, tokenizer = family
    builder = ChatPromptBuilder(
        tokenizer, "You are an agent solving a task step by step."
    )
    probe = builder.first_turn_ids(
        "Probe the weights: move the box onto the target, then report the grid state."
    )
    assert len(probe) >= 32  # spans whole KV blocks, so the prefix cache holds it
    before = await _greedy(engine, probe)
    # A request in flight on the same prompt while the update happens (continues, waits or is aborted).
    in_flight = asyncio.ensure_future(
        engine.generate(
            GenerationRequest(
                request_id=f"inflight-{mode}-{uuid.uuid4().hex[:6]}",
                prompt_token_ids=probe,
                max_tokens=64,
                ignore_eos=True,
            )
        )
    )
    await asyncio.sleep(0.5)
    perturb_weights(trainer.model, seed=hash(mode) % 1000)
    version = engine.get_weight_version() + 1
    await engine.pause(mode)
    await engine.update_weights(trainer.state_dict_for_engine(), version)
    await engine.resume()
    after = await _greedy(engine, probe)
    await asyncio.wait_for(in_flight, timeout=600)
    assert (
        after.output_token_ids != before.output_token_ids
        or after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    )
    assert after.token_versions == [version] * len(after.output_token_ids)
    expected = score_generated_tokens(trainer.model, probe, after.output_token_ids)
    gap = max(abs(a - b) for a, b in zip(after.logprobs, expected))
    assert gap <= LOGPROB_TOLERANCE, (
        f"{name}/{mode}: engine logprobs after the sync differ from the trainer's by {gap}"
    )


# -- function-tool agents (three tool-call formats) --------------------------------------------------

TOOL_FAMILIES = ("qwen2_5", "llama3", "mistral")
AGENTS = ("tool_agent", "streaming_tool_agent", "responses_tool_agent")


class ForcingRecorder(RecordingClient):
    """The family's engine as an EngineClient: records every call; call k of an episode (k < len(forced)) gets
    ``forced[k]`` as its output (the first: the tool call)."""

    def __init__(self, engine, forced: list[list[int]]) -> None:
        super().__init__(engine)
        self.forced = forced

    def rewrite(
        self, request: GenerationRequest, result: GenerationResult
    ) -> GenerationResult:
        turn = int(re.search(r"-t(\d+)-r\d+$", request.request_id).group(1))
        if turn >= len(self.forced) or result.finish_reason == "abort":
            return result
        n = len(self.forced[turn])
        return dataclasses.replace(
            result,
            output_token_ids=list(self.forced[turn]),
            logprobs=[-1.0] * n,
            token_versions=[result.weight_version] * n,
            finish_reason="stop",
        )


def _agent_config(agent: str) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=2048,
        rollout_batch_size=1,
        generation=GenerationConfig(temperature=1.0),
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent=agent if ":" in agent else f"roll_async.testing.agents:{agent}",
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


async def _episode(family, agent: str, forced_texts: tuple[str, ...] = ()):
    """One episode of ``agent`` on the family's engine; its first calls' outputs are ``forced_texts`` (default:
    the family's tool call), each tokenized and ended by the end-of-turn token."""
    from roll_async.scheduler.local import LocalRolloutScheduler

    name, _, engine, _, tokenizer = family
    eos = tokenizer.convert_tokens_to_ids(FAMILIES[name].eos_token)
    forced = [
        tokenizer.encode(text, add_special_tokens=False) + [eos]
        for text in forced_texts or (TOOL_CALL_REPLIES[name],)
    ]
    client = ForcingRecorder(engine, forced)
    scheduler = LocalRolloutScheduler(
        rollout_spec(_agent_config(agent), "train"), engines=client, tokenizer=tokenizer
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


@pytest.mark.parametrize("family", TOOL_FAMILIES, indirect=True)
@pytest.mark.parametrize("agent", AGENTS)
async def test_a_function_tool_agent_is_token_exact(family, agent):
    pytest.importorskip("openai")
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


#: Framework -> its agent (roll_async/testing): the OpenAI Agents SDK, pydantic-ai, LangGraph, smolagents.
FRAMEWORK_AGENTS = {
    "agents_sdk": "agents_sdk_chat_agent",
    "pydantic_ai": "roll_async.testing.framework_agents:pydantic_ai_agent",
    "langgraph": "roll_async.testing.framework_agents:langgraph_agent",
    "smolagents": "roll_async.testing.framework_agents:smolagents_agent",
}


@pytest.mark.parametrize("family", ["qwen2_5"], indirect=True)
async def test_agent_frameworks_stay_one_token_exact_segment(family):
    """Each framework's tool episode on the qwen2_5 engine (the real tokenizer, template, hermes parser and
    engine; the module's engine, no new one): call 1 forced to the tool call, call 2 to the final reply
    (``sunny``; smolagents: its final_answer call), since a random model writes neither. The frameworks send
    their own re-serialisations back (pydantic-ai: compact arguments; smolagents: a ``Calling tools:`` text)
    and every episode is one segment whose ids are the engine's prompts and outputs."""
    name = family[0]
    for framework, agent in FRAMEWORK_AGENTS.items():
        final = (
            '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "sunny"}}\n</tool_call>'
            if framework == "smolagents"
            else "sunny"
        )
        trajectory, metrics, calls, _ = await _episode(
            family, agent, (TOOL_CALL_REPLIES[name], final)
        )
        assert trajectory.stop_reason == "terminated", (framework, trajectory.error)
        got = trajectory.metrics
        assert got["tool_ran_for_paris"] == 1.0, framework
        assert got["finished_sunny"] == 1.0, framework
        assert metrics["rollout/agent_segment_breaks"] == 0.0, framework
        assert got["agent_dropped_generated_tokens"] == 0.0, framework
        assert len(calls) == 2, framework
        (first, first_out), (last, last_out) = calls
        head = first.prompt_token_ids + first_out.output_token_ids
        assert last.prompt_token_ids[: len(head)] == head, framework
        assert trajectory.token_ids == last.prompt_token_ids + last_out.output_token_ids
        generated = [
            t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m
        ]
        assert generated == first_out.output_token_ids + last_out.output_token_ids
