"""TurnGenerator: a stop string split across an abort ends the turn where vLLM would have ended it."""

from __future__ import annotations

import pytest

from roll_async.config.schema import GenerationConfig
from roll_async.env_managers.env_status import EnvManagerStats, PhaseReporter
from roll_async.env_managers.turn_generator import TurnGenerator
from roll_async.prompts.images import ObservationEncoder
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.trajectory import GenerationRequest, GenerationResult, Trajectory


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


class ScriptedEngine:
    """Answers each request with the next scripted (ids, finish reason, version); logprobs number the tokens."""

    def __init__(self, script: list[tuple[list[int], str, int]]) -> None:
        self.script = list(script)
        self.requests: list[GenerationRequest] = []
        self._next_logprob = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids, finish, version = self.script.pop(0)
        ids = ids[: request.max_tokens]
        logprobs = [-(self._next_logprob + i + 1) / 100 for i in range(len(ids))]
        self._next_logprob += len(ids)
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=version,
            num_prompt_tokens=len(request.prompt_token_ids),
            token_versions=[version] * len(ids),
        )

    async def abort(self, request_ids: list[str]) -> None:
        pass


def generator(engine, tokenizer, stop=("</answer>",)) -> TurnGenerator:
    return TurnGenerator(
        0,
        engine,
        generation=GenerationConfig(retry_backoff_s=0.001),
        stop=list(stop),
        observations=ObservationEncoder(None),
        stats=EnvManagerStats(),
        phases=PhaseReporter(),
        abort_backoff_s=0.0,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    )


def trajectory() -> Trajectory:
    return Trajectory(
        tag="t",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=0,
        traj_id="x",
        created_step=0,
    )


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def test_a_stop_string_split_across_an_abort_ends_the_turn_at_the_stop_string(
    tokenizer,
):
    ids = encode(tokenizer, "<answer>Up</answer> and then more words here")
    cut = ids.index(encode(tokenizer, "</")[0])  # the abort falls inside "</answer>"
    first, second = ids[: cut + 1], ids[cut + 1 :]
    assert tokenizer.decode(first).endswith("</")
    engine = ScriptedEngine([(first, "abort", 0), (second, "length", 1)])
    turns = generator(engine, tokenizer)
    generation = await turns.generate(trajectory(), 0, len(ids), prompt_ids=[1, 2, 3])
    expected = encode(tokenizer, "<answer>Up</answer>")
    assert tokenizer.decode(generation.token_ids) == "<answer>Up</answer>"
    assert generation.token_ids == expected
    assert generation.finish_reason == "stop"
    n = len(expected)
    assert generation.logprobs == [-(i + 1) / 100 for i in range(n)]
    assert generation.token_versions == [0] * len(first) + [1] * (n - len(first))
    assert generation.weight_versions == [0, 1] and generation.resumed == 1
    # the continuation was sent the partial output as prompt and fewer max_tokens
    assert engine.requests[1].prompt_token_ids == [1, 2, 3] + first
    assert engine.requests[1].max_tokens == len(ids) - len(first)


async def test_a_stop_string_inside_the_first_piece_before_an_abort_is_kept_as_vllm_returned_it(
    tokenizer,
):
    """No split: each piece already ended where vLLM saw the stop string; nothing is cut twice."""
    ids = encode(tokenizer, "<answer>Up</answer>")
    engine = ScriptedEngine([(ids[:3], "abort", 0), (ids[3:], "stop", 1)])
    generation = await generator(engine, tokenizer).generate(
        trajectory(), 0, 32, prompt_ids=[1]
    )
    assert generation.token_ids == ids and generation.finish_reason == "stop"
    assert len(generation.logprobs) == len(generation.token_versions) == len(ids)


async def test_a_split_stop_string_after_two_aborts_is_found(tokenizer):
    ids = encode(tokenizer, "<answer>Up</answer> and then more")
    stop_start = ids.index(encode(tokenizer, "</")[0])
    pieces = [
        (ids[:stop_start], "abort", 0),
        (ids[stop_start : stop_start + 1], "abort", 1),
        (ids[stop_start + 1 :], "length", 2),
    ]
    generation = await generator(ScriptedEngine(pieces), tokenizer).generate(
        trajectory(), 0, len(ids), prompt_ids=[1]
    )
    assert tokenizer.decode(generation.token_ids) == "<answer>Up</answer>"
    assert generation.finish_reason == "stop"
    assert generation.weight_versions == [0, 1, 2]
    assert (
        len(generation.logprobs)
        == len(generation.token_versions)
        == len(generation.token_ids)
    )


async def test_without_a_stop_string_a_continued_turn_runs_to_max_tokens(tokenizer):
    ids = encode(tokenizer, "<answer>Up</answer> and then more")
    engine = ScriptedEngine([(ids[:5], "abort", 0), (ids[5:], "length", 1)])
    generation = await generator(engine, tokenizer, stop=()).generate(
        trajectory(), 0, len(ids), prompt_ids=[1]
    )
    assert generation.token_ids == ids and generation.finish_reason == "length"
