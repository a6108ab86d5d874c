"""Rewards from models without a real engine: a fake judge engine, the config checks, batching on a tiny RM."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from roll_async import metrics
from roll_async.errors import ConfigError
from roll_async.prompts.tokenizers import load_tokenizer
from roll_async.rewards import (
    EpisodeRewardScorer,
    EpisodeText,
    LLMJudge,
    ModelScore,
    RewardConfig,
    RewardModelActor,
    RewardModelClient,
    build_tiny_reward_model,
    episode_text,
    judge_engine_config,
    parse_judge_score,
    reward_batch_metrics,
)
from roll_async.rewards import judge as judge_module
from roll_async.rewards.micro_batcher import MicroBatcher
from roll_async.trajectory import (
    GenerationRequest,
    GenerationResult,
    Trajectory,
    TurnRecord,
)


class CharTokenizer:
    """One token per character; a chat template that wraps the user message."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert not tokenize
        return f"<user>{messages[0]['content']}<assistant>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class FakeJudgeEngine:
    """An EngineClient whose replies, delays and failures the test scripts per request (in arrival order)."""

    def __init__(
        self,
        reply: str = "Score: 7",
        *,
        delay_s: float = 0.0,
        hang_first: int = 0,
        fail_first: int = 0,
        abort_hangs: bool = False,
    ) -> None:
        self.reply = reply
        #: A hung replica: abort never answers either (until cancelled).
        self.abort_hangs = abort_hangs
        self.aborts_cut_off = 0
        self.delay_s = delay_s
        self.hang_first = hang_first
        self.fail_first = fail_first
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        index = len(self.requests)
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if index < self.fail_first:
                raise RuntimeError("engine fault")
            await asyncio.sleep(3600 if index < self.hang_first else self.delay_s)
        finally:
            self.in_flight -= 1
        ids = [ord(c) for c in self.reply][: request.max_tokens]
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=ids,
            logprobs=[],
            finish_reason="stop",
            weight_version=0,
        )

    async def abort(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)
        if self.abort_hangs:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.aborts_cut_off += 1
                raise


def judge_config(**overrides) -> RewardConfig:
    settings = dict(
        kind="judge",
        model_path="tiny",
        max_concurrency=4,
        timeout_s=5.0,
        max_retries=1,
        retry_backoff_s=0.0,
        max_tokens=32,
        max_model_len=4096,
    )
    settings.update(overrides)
    return RewardConfig(**settings)


def make_judge(engine: FakeJudgeEngine, **overrides) -> LLMJudge:
    return LLMJudge(judge_config(**overrides), [engine], CharTokenizer())


EPISODE = EpisodeText(question="What is 2+2?", response="4", reference="4")


def finished_trajectory(
    reward: float = 1.0, stop_reason: str = "terminated"
) -> Trajectory:
    trajectory = Trajectory(
        tag="Math",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=0,
        traj_id="Math-g0-e0",
        created_step=0,
        episode_reward=reward,
        stop_reason=stop_reason,
    )
    for turn, (action, observation) in enumerate(
        [("I think 5", "Wrong, try again"), ("It is 4", "Correct!")]
    ):
        trajectory.turns.append(
            TurnRecord(
                turn=turn,
                action_text=action,
                observation=observation,
                reward=0.0,
                generated_tokens=3,
                weight_version=0,
                generate_s=0.0,
                env_step_s=0.0,
            )
        )
    return trajectory


# -- judge: concurrency, timeouts, retries, parsing ------------------------------------------------------


async def test_judge_holds_the_concurrency_bound():
    engine = FakeJudgeEngine("Score: 7", delay_s=0.02)
    judge = make_judge(engine, max_concurrency=3)
    results = await asyncio.gather(*(judge.score(EPISODE) for _ in range(10)))
    assert engine.max_in_flight == 3
    assert judge.counters.max_in_flight == 3
    assert [r.score for r in results] == [pytest.approx(0.7)] * 10
    assert judge.counters.calls == 10 and judge.counters.failures == 0


async def test_judge_request_uses_the_judge_chat_template():
    engine = FakeJudgeEngine()
    judge = make_judge(engine, prompt_template="Q={question} A={response}")
    await judge.score(EPISODE)
    (request,) = engine.requests
    prompt = "".join(chr(i) for i in request.prompt_token_ids)
    assert prompt == "<user>Q=What is 2+2? A=4<assistant>"
    assert request.max_tokens == 32 and request.temperature == 0.0
    assert request.request_id.startswith("judge-")


async def test_judge_timeout_is_counted_aborted_and_retried():
    engine = FakeJudgeEngine("Score: 10", hang_first=1)
    judge = make_judge(engine, timeout_s=0.05, max_retries=1)
    result = await judge.score(EPISODE)
    assert result.score == pytest.approx(1.0)
    assert result.timeouts == 1 and result.attempts == 2
    assert engine.aborted == [engine.requests[0].request_id]
    assert engine.requests[0].request_id != engine.requests[1].request_id
    assert judge.counters.timeouts == 1 and judge.counters.retries == 1
    assert judge.counters.failures == 0


async def test_judge_timeout_past_retries_is_a_failure_not_an_exception():
    engine = FakeJudgeEngine(hang_first=5)
    judge = make_judge(engine, timeout_s=0.02, max_retries=1)
    result = await judge.score(EPISODE)
    assert result.failed and result.timeouts == 2 and not result.parse_failed
    assert len(engine.aborted) == 2
    assert judge.counters.failures == 1 and judge.counters.in_flight == 0


async def test_judge_timeout_holds_when_the_replica_and_its_abort_hang(monkeypatch):
    """A hung replica whose abort hangs too: retries still start and score() ends in time."""
    monkeypatch.setattr(judge_module, "JUDGE_ABORT_TIMEOUT_S", 0.3, raising=False)
    engine = FakeJudgeEngine(hang_first=10, abort_hangs=True)
    judge = make_judge(engine, timeout_s=0.5, max_retries=1)
    started = time.monotonic()
    result = await asyncio.wait_for(judge.score(EPISODE), 10)
    elapsed = time.monotonic() - started
    assert elapsed < 0.5 * (1 + 1) + 0.3, elapsed
    assert result.failed and result.timeouts == 2 and result.attempts == 2
    assert len(engine.requests) == 2  # the retry started while the first abort hung
    assert engine.aborted == [r.request_id for r in engine.requests]
    await asyncio.sleep(0.5)  # each abort is cut off by its own deadline
    assert engine.aborts_cut_off == 2


@pytest.mark.parametrize(
    ("fail_first", "max_retries", "expected"), [(2, 2, 0.7), (2, 1, None)]
)
async def test_judge_retries_engine_errors(fail_first, max_retries, expected):
    engine = FakeJudgeEngine("Score: 7", fail_first=fail_first)
    judge = make_judge(engine, max_retries=max_retries)
    result = await judge.score(EPISODE)
    assert result.errors == min(fail_first, max_retries + 1)
    assert result.attempts == max_retries + 1 if expected is None else fail_first + 1
    if expected is None:
        assert result.failed and judge.counters.failures == 1
    else:
        assert result.score == pytest.approx(expected)


async def test_judge_reply_without_score_is_a_counted_parse_failure():
    engine = FakeJudgeEngine("I refuse to grade this.")
    judge = make_judge(engine, max_retries=3)
    result = await judge.score(EPISODE)
    assert result.score is None and result.parse_failed
    assert result.attempts == 1  # a reply came back: not retried
    assert result.reply == "I refuse to grade this."
    assert judge.counters.parse_failures == 1 and judge.counters.failures == 1


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is right. Score: 7", 0.7),
        ("score=5.5", 0.55),
        ("**Score:** 10", 1.0),
        ("Final: \\boxed{3}", 0.3),
        ("Score: 2 ... on reflection Score: 8", 0.8),
        ("Score: 0", 0.0),
        ("Score: 11", None),
        ("Score: -1", None),
        ("no number at all", None),
        ("", None),
    ],
)
def test_parse_judge_score(reply, expected):
    got = parse_judge_score(reply, RewardConfig().pattern(), 0.0, 10.0)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_parse_judge_score_custom_pattern_and_range():
    config = RewardConfig(score_pattern=r"RATING\[(\d)\]", score_min=1, score_max=5)
    assert parse_judge_score("RATING[5]", config.pattern(), 1, 5) == 1.0
    assert parse_judge_score("RATING[3]", config.pattern(), 1, 5) == 0.5
    assert parse_judge_score("Score: 3", config.pattern(), 1, 5) is None


def test_judge_prompt_is_cut_to_fit_max_model_len():
    judge = make_judge(FakeJudgeEngine(), max_model_len=450, max_tokens=16)
    long = EpisodeText(question="q", response="x" * 2000 + "THE END")
    ids = judge.prompt_ids(long)
    text = "".join(chr(i) for i in ids)
    assert len(ids) <= 450 - 16
    assert text.startswith("<user>You are grading") and text.endswith(
        "'Score: <number>'.<assistant>"
    )
    assert "THE END\n\nRate the answer" in text and "x" * 1900 not in text


def test_judge_prompt_renders_with_the_tiny_models_chat_template(tiny_model_path: Path):
    tokenizer = load_tokenizer(str(tiny_model_path))
    judge = LLMJudge(judge_config(), [FakeJudgeEngine()], tokenizer)
    text = tokenizer.decode(judge.prompt_ids(EPISODE))
    assert "What is 2+2?" in text and "Score: <number>" in text


def test_judge_engine_config_takes_the_reward_keys():
    config = judge_config(
        num_replicas=2, max_model_len=1024, engine={"dtype": "float32"}
    )
    engine = judge_engine_config(config)
    assert (engine.num_replicas, engine.max_model_len, engine.dtype) == (
        2,
        1024,
        "float32",
    )


# -- scorer: add / replace, metrics -----------------------------------------------------------------------


class FixedClient:
    def __init__(self, score: float | None, **extra) -> None:
        self.result = ModelScore(score=score, seconds=0.25, **extra)
        self.seen: list[EpisodeText] = []

    async def score(self, episode: EpisodeText) -> ModelScore:
        self.seen.append(episode)
        return self.result


@pytest.mark.parametrize(
    ("mode", "score", "expected"),
    [
        ("add", 0.5, 1.0 + 2 * 0.5),
        ("replace", 0.5, 2 * 0.5),
        ("add", None, 1.0),
        ("replace", None, 0.0),
    ],
)
async def test_scorer_add_and_replace(mode, score, expected):
    scorer = EpisodeRewardScorer(
        RewardConfig(mode=mode, weight=2.0), FixedClient(score)
    )
    trajectory = finished_trajectory(reward=1.0)
    outcome = await scorer.apply(trajectory, question="What is 2+2?", reference="4")
    assert outcome.reward == pytest.approx(expected)
    assert trajectory.episode_reward == pytest.approx(expected)
    assert trajectory.metrics[metrics.ENV_REWARD] == 1.0
    assert trajectory.metrics[metrics.MODEL_REWARD_FAILED] == float(score is None)
    assert (metrics.MODEL_REWARD_SCORE in trajectory.metrics) == (score is not None)


async def test_scorer_reads_the_episode_from_the_trajectory():
    client = FixedClient(1.0)
    scorer = EpisodeRewardScorer(RewardConfig(), client)
    await scorer.score(finished_trajectory(), question="What is 2+2?", reference="4")
    (seen,) = client.seen
    assert seen.response == "It is 4" and seen.reference == "4"
    assert seen.conversation == (
        "User: What is 2+2?\n\nAssistant: I think 5\n\nUser: Wrong, try again\n\nAssistant: It is 4"
    )  # the final observation ("Correct!") is left out


def test_episode_text_decodes_the_question_when_not_given():
    trajectory = finished_trajectory()
    trajectory.token_ids = [ord(c) for c in "PROMPT" + "rest"]
    trajectory.prompt_length = 6
    text = episode_text(trajectory, decode=lambda ids: "".join(chr(i) for i in ids))
    assert text.question == "PROMPT" and text.response == "It is 4"
    assert episode_text(trajectory).question == ""


@pytest.mark.parametrize("stop_reason", ["env_error", "engine_error", "aborted"])
async def test_scorer_skips_episodes_never_trained_on(stop_reason):
    client = FixedClient(1.0)
    scorer = EpisodeRewardScorer(RewardConfig(mode="replace"), client)
    outcome = await scorer.score(
        finished_trajectory(reward=0.3, stop_reason=stop_reason)
    )
    assert outcome.reward == 0.3 and outcome.model_score is None and client.seen == []


async def test_batch_metrics_from_scored_trajectories():
    batch = [finished_trajectory() for _ in range(3)]
    await EpisodeRewardScorer(RewardConfig(), FixedClient(0.5)).apply(batch[0])
    await EpisodeRewardScorer(
        RewardConfig(), FixedClient(None, timeouts=2, attempts=2)
    ).apply(batch[1])
    out = reward_batch_metrics(batch)
    assert out[metrics.TIME_REWARD_MEAN] == pytest.approx(0.25)
    assert out[metrics.TIME_REWARD_P99] == pytest.approx(0.25)
    assert out[metrics.REWARD_FAILURES] == 1.0
    assert out[metrics.REWARD_TIMEOUTS] == 2.0
    assert out[metrics.REWARD_RETRIES] == 1.0
    assert out[metrics.REWARD_PARSE_FAILURES] == 0.0
    assert reward_batch_metrics(batch[2:]) == {}


# -- config ----------------------------------------------------------------------------------------------


def write_model_config(path: Path, **config) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_config_is_omegaconf_compatible():
    merged = OmegaConf.merge(
        OmegaConf.structured(RewardConfig),
        {"kind": "reward_model", "model_path": "tiny", "engine": {"dtype": "float32"}},
    )
    config = OmegaConf.to_object(merged)
    assert isinstance(config, RewardConfig) and config.kind == "reward_model"
    config.validate("Math")


@pytest.mark.parametrize(
    ("overrides", "key", "hint"),
    [
        ({"kind": "critic"}, "kind", "judge, reward_model"),
        ({"mode": "multiply"}, "mode", "replace"),
        ({"model_path": None}, "model_path", "tiny"),
        ({"model_path": "/no/such/judge"}, "model_path", "does not exist"),
        ({"prompt_template": "Rate {question}"}, "prompt_template", "{response}"),
        (
            {"prompt_template": "{response} {answer}"},
            "prompt_template",
            "unknown field",
        ),
        ({"prompt_template": "{response"}, "prompt_template", "braces"),
        ({"max_concurrency": 0}, "max_concurrency", "must be >= 1"),
        ({"timeout_s": 0}, "timeout_s", "> 0"),
        ({"score_pattern": "Score: \\d+"}, "score_pattern", "capture group"),
        ({"score_pattern": "Score: ("}, "score_pattern", "not a regex"),
        ({"score_min": 5, "score_max": 5}, "score_max", "greater"),
        ({"max_tokens": 4096, "max_model_len": 4096}, "max_tokens", "no room"),
        ({"max_tokens": 4088, "max_model_len": 4096}, "max_model_len", "below 4088"),
        ({"engine": {"dtpye": "float32"}}, "engine", "dtpye"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(overrides, key, hint):
    with pytest.raises(ConfigError) as info:
        judge_config(**overrides).validate("Math")
    assert f"custom_envs.Math.reward.{key}" in str(info.value)
    assert hint in str(info.value)


def test_reward_model_path_must_be_a_one_label_classifier(tmp_path: Path):
    causal = write_model_config(tmp_path / "causal", architectures=["Qwen2ForCausalLM"])
    two = write_model_config(
        tmp_path / "two", architectures=["Qwen2ForSequenceClassification"]
    )  # no id2label: transformers' default of 2 labels
    good = write_model_config(
        tmp_path / "rm",
        architectures=["Qwen2ForSequenceClassification"],
        id2label={"0": "LABEL_0"},
    )
    with pytest.raises(ConfigError, match="ForSequenceClassification"):
        RewardConfig(kind="reward_model", model_path=str(causal)).validate("Math")
    with pytest.raises(ConfigError, match="num_labels=2"):
        RewardConfig(kind="reward_model", model_path=str(two)).validate("Math")
    RewardConfig(kind="reward_model", model_path=str(good)).validate("Math")
    RewardConfig(kind="judge", model_path=str(causal)).validate("Math")
    with pytest.raises(ConfigError, match="has no config.json"):
        RewardConfig(model_path=str(tmp_path)).validate("Math")


# -- reward model: batching ------------------------------------------------------------------------------


async def test_micro_batcher_batches_within_the_window():
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return [i * 10 for i in items]

    batcher = MicroBatcher(run, batch_size=4, window_s=0.05)
    results = await asyncio.gather(*(batcher.submit([i]) for i in range(10)))
    assert results == [[i * 10] for i in range(10)]
    assert sizes == [4, 4, 2]
    assert batcher.stats.batches == 3 and batcher.stats.max_batch_size == 4
    assert await batcher.submit([7, 8]) == [70, 80]  # a later lone call is served too
    await batcher.close()


async def test_micro_batcher_failure_reaches_every_caller_of_the_batch():
    async def run(items: list[int]) -> list[int]:
        raise ValueError("model fault")

    batcher = MicroBatcher(run, batch_size=8, window_s=0.01)
    results = await asyncio.gather(
        *(batcher.submit([i]) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, ValueError) for r in results)
    await batcher.close()


async def test_reward_model_client_bounds_and_times_out():
    calls: list[list[str]] = []

    async def score_texts(texts: list[str]) -> list[float]:
        calls.append(texts)
        if len(calls) == 1:
            await asyncio.sleep(3600)
        return [0.25]

    config = RewardConfig(
        kind="reward_model",
        prompt_template="Q: {question}\nA: {response}",
        timeout_s=0.05,
        retry_backoff_s=0.0,
    )
    client = RewardModelClient(config, score_texts)
    result = await client.score(EPISODE)
    assert result.score == 0.25 and result.timeouts == 1
    assert calls[-1] == ["Q: What is 2+2?\nA: 4"]


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm") / "rm")


async def test_reward_model_actor_batches_and_matches_single_passes(
    tiny_reward_model: Path,
):
    RewardConfig(kind="reward_model", model_path=str(tiny_reward_model)).validate(
        "Math"
    )
    actor = RewardModelActor(str(tiny_reward_model), batch_size=4, batch_window_s=0.05)
    texts = [f"answer {'four ' * i}" for i in range(1, 7)]
    batched = await asyncio.gather(*(actor.score([t]) for t in texts))
    stats = actor.stats()
    assert (
        stats["batches"] == 2 and stats["max_batch_size"] == 4 and stats["items"] == 6
    )
    singles = [actor.forward([t]) for t in texts]
    assert [b[0] for b in batched] == pytest.approx([s[0] for s in singles], abs=1e-4)
    assert len(set(round(s[0], 6) for s in singles)) > 1  # the head is not constant
    await actor.batcher.close()


async def test_reward_model_keeps_the_end_of_a_text_longer_than_its_context(
    tiny_reward_model: Path,
):
    """Three endings after a long prefix: the answer must survive truncation to max_length."""
    actor = RewardModelActor(str(tiny_reward_model), max_length=64)
    client = RewardModelClient(
        RewardConfig(kind="reward_model", retry_backoff_s=0.0),
        actor.score,
    )
    prefix = "Let me think about this step by step. " * 40
    endings = ["The answer is 4.", "I refuse to answer.", "Banana banana banana."]
    scores = [
        (await client.score(EpisodeText(question="What is 2+2?", response=prefix + e)))
        for e in endings
    ]
    assert all(not s.failed for s in scores)
    assert len(actor.tokenizer(prefix)["input_ids"]) > 64
    assert len({round(s.score, 6) for s in scores}) == 3, [s.score for s in scores]
    await actor.batcher.close()
