"""A reward model (a sequence-classification checkpoint) served by a Ray actor that batches its callers' texts.

Each EnvManager asks for one score when an episode ends; one actor owning the
model on CPU gathers those requests into batched forward passes, and callers
reach it through RewardModelClient, which bounds, times out and retries the
calls like the judge's.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import ray

from roll_async.config.reward_rules import TINY_MODEL
from roll_async.config.sections import RewardConfig
from roll_async.rewards.episode_text import EpisodeText
from roll_async.rewards.micro_batcher import MicroBatcher
from roll_async.rewards.model_call import BoundedModelCaller, ModelScore, RewardCounters
from roll_async.rewards.tiny_reward_model import build_tiny_reward_model

#: Concurrent ``score`` calls one actor accepts (they wait in its batcher, not in Ray's queue).
RM_ACTOR_MAX_CONCURRENCY = 1_000


def reward_model_path(config: RewardConfig) -> str:
    """The reward model's directory (``tiny``: the offline tiny reward model, built if missing)."""
    if config.model_path == TINY_MODEL:
        return str(build_tiny_reward_model())
    return str(config.model_path)


class RewardModelActor:
    """Loads ``AutoModelForSequenceClassification`` on CPU (float32); ``score(texts)`` returns one float per text.

    Plain class: ``launch_reward_model`` makes it a Ray actor; tests use it in-process.
    """

    def __init__(
        self,
        model_path: str,
        *,
        batch_size: int = 16,
        batch_window_s: float = 0.01,
        max_length: int = 2048,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
    ) -> None:
        # torch and transformers are heavy: loaded only inside the process that serves the model.
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # A text longer than max_length keeps its end: the answer being scored is there (the default
        # template puts the response last); cutting it off would score every long episode alike.
        self.tokenizer.truncation_side = "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_path, dtype=torch.float32, trust_remote_code=trust_remote_code
        ).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.max_length = max_length
        self.batcher: MicroBatcher[str, float] = MicroBatcher(
            self._forward_batch, batch_size=batch_size, window_s=batch_window_s
        )

    async def score(self, texts: list[str]) -> list[float]:
        """One scalar reward per text (the model's single logit)."""
        return await self.batcher.submit(list(texts))

    async def _forward_batch(self, texts: list[str]) -> list[float]:
        return await asyncio.to_thread(self.forward, texts)

    def forward(self, texts: list[str]) -> list[float]:
        """One forward pass over ``texts`` (no batching window); a text over max_length loses its start."""
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with self._torch.inference_mode():
            logits = self.model(**encoded).logits
        return [float(v) for v in logits[:, 0].float().tolist()]

    def stats(self) -> dict[str, float]:
        """Batches run, texts scored, largest batch so far."""
        return {key: float(value) for key, value in asdict(self.batcher.stats).items()}


async def launch_reward_model(
    config: RewardConfig,
    *,
    name: str = "reward_model",
    num_cpus: float = 1.0,
    startup_timeout_s: float = 600.0,
) -> Any:
    """Start a RewardModelActor (Ray actor ``name``) and wait until its model is loaded; returns its handle."""
    actor_cls = ray.remote(RewardModelActor)
    handle = actor_cls.options(
        name=name,
        num_cpus=num_cpus,
        max_concurrency=RM_ACTOR_MAX_CONCURRENCY,
        max_restarts=0,
    ).remote(
        reward_model_path(config),
        batch_size=config.batch_size,
        batch_window_s=config.batch_window_s,
        max_length=config.max_model_len,
        trust_remote_code=config.trust_remote_code,
        num_threads=max(1, int(num_cpus)),
    )
    try:
        await asyncio.wait_for(handle.stats.remote(), timeout=startup_timeout_s)
    except BaseException:
        ray.kill(handle, no_restart=True)
        raise
    return handle


class RewardModelClient:
    """Scores an EpisodeText with a reward model (a RewardClient): renders the template, one text per call."""

    def __init__(
        self,
        config: RewardConfig,
        score_texts: Callable[[list[str]], Awaitable[list[float]]],
        *,
        caller: BoundedModelCaller | None = None,
    ) -> None:
        self.config = config
        self._score_texts = score_texts
        self._template = config.template()
        self.caller = caller or BoundedModelCaller(config)

    @classmethod
    def from_handle(cls, config: RewardConfig, handle: Any) -> RewardModelClient:
        """A client of a RewardModelActor Ray actor (from ``launch_reward_model``)."""

        async def score_texts(texts: list[str]) -> list[float]:
            scores: list[float] = await handle.score.remote(texts)
            return scores

        return cls(config, score_texts)

    @property
    def counters(self) -> RewardCounters:
        return self.caller.counters

    async def score(self, episode: EpisodeText) -> ModelScore:
        """The model's raw scalar for the rendered episode; timeouts and actor errors come back as ``score=None``."""
        text = self._template.format(**episode.fields())

        async def attempt(index: int) -> tuple[float | None, str]:
            (value,) = await self._score_texts([text])
            value = float(value)
            return (value if math.isfinite(value) else None), ""

        return await self.caller.call(attempt)
