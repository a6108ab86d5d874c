"""Function calling, streaming and the Responses API of agent sessions: the real openai client and aiohttp
gateway, vLLM's own tool parsers, zoo-family templates on small test tokenizers, and a FAKE engine (no model)
whose output is a fixed token sequence per call (the family's tool-call text, then plain replies).

The real-engine versions are in tests/integration/test_model_families.py.
"""

from __future__ import annotations

import json
import types

import pytest

from roll_async import metrics
from roll_async.agent_gateway.chat_request import render_form
from roll_async.agent_gateway.tool_calls import (
    ToolCallParser,
    detect_tool_parser,
    parse_tool_request,
)
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    TrainerConfig,
    validate_config,
)
from roll_async.env_managers.worker import build_env_managers
from roll_async.model.families import FAMILIES
from roll_async.testing.agents import PARSED_CALL, TOOL_CALL_REPLIES, WEATHER_TOOL
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.family_tokenizers import build_family_test_tokenizer
from roll_async.trainer.collate import collate_trajectories
from roll_async.trainer.grpo_trainer import GRPOTrainer, token_lag
from roll_async.trajectory import EpisodeSpec
from tests.unit.agent_gateway.test_agent_sessions import play_one

pytest.importorskip("openai")
pytest.importorskip("vllm")

TOOL_FAMILIES = ("qwen2_5", "llama3", "mistral")
PARSERS = {"qwen2_5": "hermes", "llama3": "llama3_json", "mistral": "mistral"}
SYSTEM = {"role": "system", "content": "You are a test agent."}
USER = {"role": "user", "content": "What is the weather in Paris?"}


def agent_config(agent: str, tool_parser: str | None = None) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=2048,
        rollout_batch_size=1,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent=agent if ":" in agent else f"roll_async.testing.agents:{agent}",
                max_steps=6,
                max_tokens_per_step=64,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Agent"]
        ),
    )
    config.model.tool_parser = tool_parser
    validate_config(config)
    return config


def scripted(tokenizer, family: str, versions: list[int] | None = None):
    """A fake engine answering call 1 with the family's tool call, later calls with a plain reply."""
    eos = tokenizer.convert_tokens_to_ids(FAMILIES[family].eos_token)
    call = tokenizer.encode(TOOL_CALL_REPLIES[family], add_special_tokens=False)
    plain = tokenizer.encode("sunny", add_special_tokens=False)
    outputs = [call + [eos], plain + [eos], plain + [eos]]
    engine = FakeEngine()

    def output(request):
        index = len(engine.requests) - 1
        if versions is not None:
            engine.weight_version = versions[index]
        return outputs[index]

    engine._output_fn = output
    return engine, outputs


@pytest.fixture(scope="module", params=TOOL_FAMILIES)
def family(request):
    return request.param, build_family_test_tokenizer(request.param)


def test_parsers_are_detected_from_the_templates_and_parse_each_family_s_call(
    family,
):
    name, tokenizer = family
    parser = detect_tool_parser(FAMILIES[name].chat_template)
    assert parser == PARSERS[name]
    tools = parse_tool_request({"tools": [WEATHER_TOOL]})
    reply = ToolCallParser(parser, tokenizer).parse(
        TOOL_CALL_REPLIES[name], tools, "call0000"
    )
    assert reply.tool_calls == [PARSED_CALL] and reply.parse_error is None
    broken = TOOL_CALL_REPLIES[name].replace('"city"', "city")
    bad = ToolCallParser(parser, tokenizer).parse(broken, tools, "call0000")
    assert bad.tool_calls == [] and bad.content == broken and bad.parse_error


async def test_a_tool_using_agent_is_token_exact_with_tool_results_masked(family):
    name, tokenizer = family
    engine, outs = scripted(tokenizer, name)
    trajectory, manager = await play_one(agent_config("tool_agent"), engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["tool_calls_seen"] == 1.0
    assert trajectory.metrics["agent_tool_calls"] == 1.0
    assert trajectory.metrics["agent_segment_breaks"] == 0.0
    builder = manager.prompts.with_tools([WEATHER_TOOL])
    p0, p1, p2 = engine.prompts
    assert p0 == builder.render_ids([SYSTEM, USER], True)  # tools through the template
    tool_message = {
        "role": "tool",
        "tool_call_id": "call00000",
        "content": "sunny in Paris",
    }
    after = render_form(
        [{"role": "assistant", "content": "", "tool_calls": [PARSED_CALL]}]
    )[0]
    delta = builder.closure_ids_after(outs[0]) + builder.continuation_ids(
        [tool_message], after
    )
    assert p1 == p0 + outs[0] + delta  # never a re-render of the tool-call reply
    assert "sunny in Paris" in tokenizer.decode(delta)
    user = {"role": "user", "content": "Go on (1)."}
    assert p2 == p1 + outs[1] + builder.closure_ids_after(
        outs[1]
    ) + builder.continuation_ids([user])
    assert trajectory.token_ids == p2 + outs[2]
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == sum(outs, [])  # the tool result and template ids are masked out
    assert len(trajectory.token_versions) == len(trajectory.token_ids)


@pytest.mark.parametrize("agent", ["streaming_tool_agent", "responses_tool_agent"])
async def test_streaming_and_the_responses_api_give_the_same_trajectory(agent):
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine, _ = scripted(tokenizer, "qwen2_5")
    plain, _ = await play_one(agent_config("tool_agent"), engine, tokenizer)
    engine2, _ = scripted(tokenizer, "qwen2_5")
    other, _ = await play_one(agent_config(agent), engine2, tokenizer)
    assert other.stop_reason == "terminated", other.error
    assert other.metrics["tool_calls_seen"] == 1.0
    assert other.token_ids == plain.token_ids
    assert other.response_mask == plain.response_mask
    assert other.logprobs == plain.logprobs
    assert engine2.prompts == engine.prompts


async def test_unparseable_calls_are_content_and_counted():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    broken = tokenizer.encode(
        "<tool_call>\n{not json</tool_call>", add_special_tokens=False
    )
    engine = FakeEngine(lambda r: broken + [eos])
    trajectory, _ = await play_one(agent_config("tool_agent"), engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["tool_calls_seen"] == 0.0
    assert trajectory.metrics["agent_tool_parse_errors"] == 3.0
    assert (
        metrics.rollout_metrics([trajectory], step=0)[metrics.AGENT_TOOL_PARSE_ERRORS]
        == 3.0
    )


async def test_tool_choice_required_without_a_call_is_content_and_counted():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine = FakeEngine(tokens_per_request=3)
    trajectory, _ = await play_one(agent_config("tool_choice_agent"), engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["got_calls"] == 0.0
    assert trajectory.metrics["finish_stop"] == 1.0
    assert trajectory.metrics["agent_tool_choice_unmet"] == 1.0
    assert (
        metrics.rollout_metrics([trajectory], step=0)[metrics.AGENT_TOOL_CHOICE_UNMET]
        == 1.0
    )


async def test_bad_tool_requests_are_400s_naming_the_parameter():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine = FakeEngine(tokens_per_request=2)
    trajectory, _ = await play_one(
        agent_config("bad_tool_requests_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    expected = {
        "bad_schema": "tools",
        "unknown_tool_call_id": "messages",
        "penalty": "presence_penalty",
        "logit_bias": "logit_bias",
        "n2": "n",
        "structured": "response_format",
        "named_unknown": "tool_choice",
        "previous_response_id": "previous_response_id",
    }
    for case, param in expected.items():
        assert trajectory.metrics[case] == 400.0, case
        assert trajectory.metrics.get(f"param_{case}_{param}") == 1.0, case
    assert len(engine.requests) == 1  # refused requests never reach the engine


async def test_a_template_that_cannot_render_tools_is_a_400_on_tools():
    tokenizer = build_chatml_test_tokenizer()  # its template ignores `tools`
    engine = FakeEngine(tokens_per_request=2)
    trajectory, _ = await play_one(
        agent_config("unservable_requests_agent", tool_parser="hermes"),
        engine,
        tokenizer,
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["tools"] == 400.0


async def test_max_token_lag_masks_stale_agent_tokens():
    """Each generated token of an agent segment keeps its version; max_token_lag drops the stale ones."""
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine, outs = scripted(tokenizer, "qwen2_5", versions=[0, 1, 2])
    trajectory, _ = await play_one(agent_config("tool_agent"), engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    generated_versions = [
        v for v, m in zip(trajectory.token_versions, trajectory.response_mask) if m
    ]
    assert generated_versions == [0] * len(outs[0]) + [1] * len(outs[1]) + [2] * len(
        outs[2]
    )
    assert all(
        v == -1
        for v, m in zip(trajectory.token_versions, trajectory.response_mask)
        if not m
    )
    trajectory.group_id = 0
    batch = collate_trajectories([trajectory], pad_token_id=0, policy_version=2)
    lag = token_lag(batch)
    assert int(lag.max()) == 2
    trainer = types.SimpleNamespace(config=TrainerConfig(max_token_lag=1))
    mask = GRPOTrainer._loss_mask(trainer, batch)
    kept = mask[0].nonzero().flatten().tolist()
    stale = [i for i, v in enumerate(trajectory.token_versions) if v == 0]
    assert stale and not set(stale) & set(kept)
    fresh = [
        i for i, v in enumerate(trajectory.token_versions) if v in (1, 2) and i > 0
    ]
    assert set(fresh) <= set(kept)


async def test_the_tool_calling_example_agent_plays_with_parsed_calls():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = tokenizer.encode(
        '<tool_call>\n{"name": "move", "arguments": {"direction": "Right"}}\n</tool_call>',
        add_special_tokens=False,
    )
    engine = FakeEngine(lambda r: call + [eos])
    config = agent_config("examples.agent_tool_calling:play_with_tools")
    config.custom_envs["Agent"].env_config = {"size": 3, "p": 0.8, "is_slippery": False}
    trajectory, _ = await play_one(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["agent_tool_calls"] >= 1.0
    assert trajectory.metrics["agent_segment_breaks"] == 0.0
    assert trajectory.metrics["agent_tool_parse_errors"] == 0.0


async def test_the_responses_api_streams_events_ending_in_the_completed_response():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    engine, _ = scripted(tokenizer, "qwen2_5")
    trajectory, _ = await play_one(
        agent_config("streaming_responses_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert {
        k: trajectory.metrics[k]
        for k in ("created_first", "completed_last", "calls", "paris")
    } == {
        "created_first": 1.0,
        "completed_last": 1.0,
        "calls": 1.0,
        "paris": 1.0,
    }


async def test_tool_choice_none_parses_nothing_and_a_met_named_choice_is_served():
    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = tokenizer.encode(TOOL_CALL_REPLIES["qwen2_5"], add_special_tokens=False)
    engine = FakeEngine(lambda r: call + [eos])
    trajectory, _ = await play_one(
        agent_config("tool_choice_variants_agent"), engine, tokenizer
    )
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.metrics["none_calls"] == 0.0
    assert trajectory.metrics["none_has_text"] == 1.0
    assert trajectory.metrics["named_calls"] == 1.0
    assert trajectory.metrics["agent_tool_choice_unmet"] == 0.0
    # the two calls declare the same tools but the second does not extend the first: a new segment
    assert trajectory.metrics["agent_segments"] == 2.0


def test_preflight_names_a_tool_parser_that_is_not_vllm_s():
    from roll_async.errors import ConfigError
    from roll_async.pipelines.preflight import check_tool_parser

    config = agent_config("tool_agent", tool_parser="no_such_parser")
    with pytest.raises(
        ConfigError, match="model.tool_parser='no_such_parser' is not one of"
    ):
        check_tool_parser(config, build_family_test_tokenizer("qwen2_5"))
    config.model.tool_parser = "mistral"  # needs [TOOL_CALLS] in the vocabulary
    with pytest.raises(ConfigError, match="does not fit this model's tokenizer"):
        check_tool_parser(config, build_family_test_tokenizer("qwen2_5"))
    config.model.tool_parser = "hermes"
    check_tool_parser(config, build_family_test_tokenizer("qwen2_5"))


def env_config(env_type: str, env_config: dict) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=2048,
        rollout_batch_size=1,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Env": CustomEnvConfig(
                env_type=env_type,
                max_steps=3,
                max_tokens_per_step=64,
                env_config=env_config,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Env"]
        ),
    )
    validate_config(config)
    return config


async def play_env(config: PipelineConfig, engine: FakeEngine, tokenizer):
    (manager,) = build_env_managers(
        rollout_spec(config, "train"),
        [(0, "Env")],
        scheduler=None,
        engine_for=lambda _: engine,
        tokenizer=tokenizer,
    )
    trajectory = await manager._run_episode(
        EpisodeSpec(tag="Env", group_id=0, episode_id=1, seed=3, created_step=0)
    )
    return trajectory, manager


async def test_a_tool_using_env_gets_parsed_calls_and_tool_results_token_exact():
    from roll_async.envs import make_env

    tokenizer = build_family_test_tokenizer("qwen2_5")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = make_env("retrieval_qa", {"action_format": "tools"})
    env.reset(3)
    answer = env.question["answers"][0]

    def call(name: str, arguments: dict) -> list[int]:
        text = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
        return tokenizer.encode(text, add_special_tokens=False) + [eos]

    outs = [call("search", {"query": "mountain"}), call("answer", {"answer": answer})]
    replies = iter(outs)
    engine = FakeEngine(lambda r: next(replies))
    config = env_config("retrieval_qa", {"action_format": "tools"})
    trajectory, manager = await play_env(config, engine, tokenizer)
    assert trajectory.stop_reason == "terminated", trajectory.error
    assert trajectory.episode_reward == 1.0 and trajectory.num_turns == 2
    assert trajectory.metrics["agent_tool_calls"] == 2.0
    assert trajectory.metrics["agent_tool_parse_errors"] == 0.0
    builder = manager.prompts.with_tools(env.tools())
    p0, p1 = engine.prompts
    assert p0 == builder.first_turn_ids(
        manager.settings.custom_env.instruction_template.format(
            instruction=env.instruction(),
            observation=env.render_text(),
            reward=0.0,
            turn=0,
        )
    )
    observation = trajectory.turns[0].observation
    assert observation.startswith('Search results for "mountain"')
    parsed = {
        "id": "call00000",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query": "mountain"}'},
    }
    after = render_form([{"role": "assistant", "content": "", "tool_calls": [parsed]}])[
        0
    ]
    delta = builder.closure_ids_after(outs[0]) + builder.continuation_ids(
        [{"role": "tool", "tool_call_id": "call00000", "content": observation}], after
    )
    assert p1 == p0 + outs[0] + delta
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert generated == outs[0] + outs[1]


def test_code_env_runs_and_submits_through_its_tools():
    from roll_async.envs import make_env
    from roll_async.envs.tool_actions import encode_tool_calls

    env = make_env("code", {"action_format": "tools"})
    _, info = env.reset(0)
    assert [t["function"]["name"] for t in info["tools"]] == ["run_python", "submit"]
    run = {"name": "run_python", "arguments": json.dumps({"code": "print(6 * 7)"})}
    observation, _, done, _, step_info = env.step(
        encode_tool_calls([{"function": run}])
    )
    assert "42" in observation and not done and step_info["metrics"]["action_is_valid"]
    observation, reward, done, _, step_info = env.step("no call at all")
    assert not step_info["metrics"]["action_is_valid"] and reward < 0
    submit = {"name": "submit", "arguments": json.dumps({"code": env.task["solution"]})}
    _, reward, done, _, _ = env.step(encode_tool_calls([{"function": submit}]))
    assert done and reward == 1.0 and env.success
    assert env.expert_responses() is None
