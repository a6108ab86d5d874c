"""Test aids for the rollout core: small scripted envs and a tiny ChatML tokenizer.

They live in the package (not under tests/) so Ray workers can import them by
module path. Nothing here is used by the production path.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class FailurePlan:
    """Shared, thread-safe failure budget for in-process tests: the first N resets/steps (over all envs) fail."""

    reset_failures: int = 0
    step_failures: int = 0
    step_hangs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, kind: str) -> bool:
        with self._lock:
            left = getattr(self, kind)
            if left > 0:
                setattr(self, kind, left - 1)
                return True
            return False


class ScriptedEnv:
    """A deterministic text env: terminates after ``episode_length`` steps.

    Reward per step: ``reward`` (a number) or, with ``reward="seed_parity"``,
    1.0 on odd seeds and 0.0 on even ones; ``reward="random"`` draws 0 or 1 per
    episode. ``step_latency_s`` makes steps slow (blocking sleep: a sync env runs
    in the thread pool). Failures: ``fail_rate`` (random per reset/step),
    ``fail_on_seed_mod`` (reset raises when ``seed % fail_on_seed_mod == 0``),
    ``hang_s`` with ``hang_on_step`` (step ``hang_on_step`` sleeps ``hang_s``),
    or a shared ``FailurePlan`` (in-process tests only).
    """

    def __init__(
        self,
        episode_length: int = 3,
        step_latency_s: float = 0.0,
        reset_latency_s: float = 0.0,
        reward: float | str = 1.0,
        fail_rate: float = 0.0,
        fail_on_seed_mod: int = 0,
        hang_on_step: int | None = None,
        hang_s: float = 0.0,
        failure_plan: FailurePlan | None = None,
        observation_words: int = 2,
    ) -> None:
        self.episode_length = episode_length
        self.step_latency_s = step_latency_s
        self.reset_latency_s = reset_latency_s
        self.reward = reward
        self.fail_rate = fail_rate
        self.fail_on_seed_mod = fail_on_seed_mod
        self.hang_on_step = hang_on_step
        self.hang_s = hang_s
        self.failure_plan = failure_plan
        self.observation_words = observation_words
        self.actions: list[str] = []
        self.seeds: list[int] = []
        self.closed = False
        self._t = 0
        self._seed = 0
        self._episode_reward = 0.0
        self._random = random.Random()

    def _observation(self) -> str:
        return " ".join([f"s{self._seed % 97}t{self._t}"] * self.observation_words)

    def _maybe_fail(self, what: str, kind: str) -> None:
        if self.failure_plan is not None and self.failure_plan.take(kind):
            raise RuntimeError(f"planned {what} failure")
        if self.fail_rate and self._random.random() < self.fail_rate:
            raise RuntimeError(f"random {what} failure")

    def _hang_now(self) -> bool:
        planned = self.failure_plan is not None and self.failure_plan.take("step_hangs")
        return planned or (self.hang_on_step is not None and self._t == self.hang_on_step)

    def _reset_now(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._seed, self._t = int(seed), 0
        self.seeds.append(self._seed)
        if self.fail_on_seed_mod and self._seed % self.fail_on_seed_mod == 0:
            raise RuntimeError(f"reset fails on seed {seed}")
        self._maybe_fail("reset", "reset_failures")
        if self.reward == "random":
            self._episode_reward = float(self._random.random() < 0.5)
        return self._observation(), {"instruction": "Count up."}

    def _step_reward(self) -> float:
        if self.reward == "seed_parity":
            return float(self._seed % 2)
        if self.reward == "random":
            return self._episode_reward
        return float(self.reward)

    def _step_now(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._maybe_fail("step", "step_failures")
        self.actions.append(action_text)
        self._t += 1
        terminated = self._t >= self.episode_length
        metrics = {"success": terminated, "action_is_valid": True}
        return self._observation(), self._step_reward(), terminated, False, {"metrics": metrics}

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        time.sleep(self.reset_latency_s)
        return self._reset_now(seed)

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep((self.hang_s if self._hang_now() else 0.0) + self.step_latency_s)
        return self._step_now(action_text)

    def close(self) -> None:
        self.closed = True


class AsyncScriptedEnv(ScriptedEnv):
    """ScriptedEnv with ``async def`` reset/step (latency via asyncio.sleep)."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:  # type: ignore[override]
        await asyncio.sleep(self.reset_latency_s)
        return self._reset_now(seed)

    async def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:  # type: ignore[override]
        await asyncio.sleep((self.hang_s if self._hang_now() else 0.0) + self.step_latency_s)
        return self._step_now(action_text)


def scripted_env_factory(tag: str, env_config: dict[str, Any]) -> ScriptedEnv:
    """EnvFactory for tests: ``env_config["async"]`` picks AsyncScriptedEnv; the rest are ScriptedEnv kwargs."""
    config = dict(env_config)
    cls = AsyncScriptedEnv if config.pop("async", False) else ScriptedEnv
    return cls(**config)


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_chatml_test_tokenizer(save_dir: str | Path | None = None) -> Any:
    """A byte-level BPE tokenizer (~350 tokens) with a ChatML template, trained in about a second, offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "system user assistant You are an agent. Reply with your action inside <answer></answer>.",
        "<answer>Up</answer> <answer>Down</answer> <answer>Left</answer> <answer>Right</answer> Count up.",
        "state s1t0 s2t1 s3t2 reward 0 1 2 3 4 5 6 7 8 9 the grid is ### #P# ...",
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE
    )
    if save_dir is not None:
        hf.save_pretrained(str(save_dir))
    return hf


# -- agent sessions: agents written only against the openai client (tests import them by path) --------


async def three_turn_agent(client: Any, task: Any) -> dict:
    """Three chat calls that extend one another (append-only history); reward 1.0."""
    served = [m.id for m in (await client.models.list()).data]
    assert served == [task.model], served
    messages = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": f"Task with seed {task.seed}. Say something."},
    ]
    for turn in range(3):
        reply = await client.chat.completions.create(
            model=task.model, messages=messages, max_tokens=8, temperature=0.9, top_p=0.95, stop=["STOP"]
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if turn < 2:
            messages.append({"role": "user", "content": f"Feedback {turn}: go on."})
    return {"reward": 1.0, "metrics": {"turns_played": 3.0}}


async def history_rewriting_agent(client: Any, task: Any) -> float:
    """Call 1; call 2 replaces call 1's reply by a summary (a rewrite: new segment); call 3 extends call 2."""
    system = {"role": "system", "content": "You are a test agent."}
    first = [system, {"role": "user", "content": "Start."}]
    reply = await client.chat.completions.create(model=task.model, messages=first, max_tokens=8)
    rewritten = [system, {"role": "user", "content": "Start."}, {"role": "assistant", "content": "(summary of my reply)"},
                 {"role": "user", "content": "Continue."}]
    reply = await client.chat.completions.create(model=task.model, messages=rewritten, max_tokens=8)
    extended = rewritten + [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "Finish."}]
    await client.chat.completions.create(model=task.model, messages=extended, max_tokens=1000)  # capped by the config
    return 0.5


async def raising_agent(client: Any, task: Any) -> float:
    """One call, then the agent's own code fails."""
    await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4)
    raise RuntimeError("agent bug")


async def idling_agent(client: Any, task: Any) -> float:
    """One call, then the agent's own code hangs (longer than env_step_timeout_s)."""
    await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4)
    await asyncio.sleep(3600)
    return 0.0


async def unservable_requests_agent(client: Any, task: Any) -> dict:
    """Sends requests the endpoint cannot serve; returns how each was answered (status codes), then plays one call."""
    import openai

    statuses: dict[str, float] = {}
    messages = [{"role": "user", "content": "Hi."}]
    attempts = {
        "tools": dict(model=task.model, messages=messages, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
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
    await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
    return {"reward": 0.0, "metrics": statuses}
