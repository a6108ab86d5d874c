"""Engine behaviour logprobs vs trainer logprobs on the same generated tokens (real CPU vLLM, same weights).

The engine reports logprobs of the distribution that sampled (processed_logprobs:
temperature, top-k, top-p, renormalised); the trainer scores the same tokens under the
same transformation (``score_generated_tokens``). They must agree to kernel noise at any
sampling settings, and must disagree measurably when the trainer skips the transformation
(so this test can fail).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from roll_async.sampling import SamplingSettings
from roll_async.trajectory import GenerationRequest

pytestmark = pytest.mark.integration

#: Largest |engine - trainer| logprob allowed on any generated token (float32 CPU kernels differ;
#: measured max 9.5e-7 on the tiny model at every setting below; 100x margin).
AGREEMENT_TOL = 1e-4
#: Smallest mean |engine - raw trainer| that shows the transformation matters for these settings.
MISMATCH_MIN = 0.02

CASES = [
    SamplingSettings(1.0, 1.0, -1),
    SamplingSettings(0.7, 0.9, -1),
    SamplingSettings(0.7, 1.0, 20),
    SamplingSettings(0.7, 0.9, 50),
]


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    """A second-turn prompt: the engine and the trainer score with a multi-turn prefix."""
    messages = [
        {"role": "user", "content": "Walk to the goal.\n_G_\n__P"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "_G_\n_P_\n___"},
    ]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


@pytest.fixture(scope="module")
def hf_model(tiny_model_path):
    import torch

    from roll_async.trainer.model_loading import load_causal_lm

    return load_causal_lm(str(tiny_model_path), torch.float32, torch.device("cpu"))


async def _generate(
    engine, prompt: list[int], settings: SamplingSettings, n: int = 6, tokens: int = 24
):
    requests = [
        GenerationRequest(
            request_id=f"lp-{uuid.uuid4().hex[:10]}",
            prompt_token_ids=prompt,
            max_tokens=tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            seed=100 + i,
            ignore_eos=True,
        )
        for i in range(n)
    ]
    return await asyncio.gather(*(engine.generate.remote(r) for r in requests))


@pytest.mark.parametrize("settings", CASES, ids=str)
async def test_engine_and_trainer_logprobs_agree_under_the_sampling_transform(
    engine, prompt, hf_model, settings
):
    from roll_async.trainer.scoring import score_generated_tokens

    results = await _generate(engine, prompt, settings)
    worst = 0.0
    raw_gaps: list[float] = []
    for result in results:
        assert len(result.logprobs) == len(result.output_token_ids) > 0
        trainer = score_generated_tokens(
            hf_model, prompt, result.output_token_ids, settings
        )
        worst = max(worst, max(abs(a - b) for a, b in zip(trainer, result.logprobs)))
        raw = score_generated_tokens(hf_model, prompt, result.output_token_ids, None)
        raw_gaps += [abs(a - b) for a, b in zip(raw, result.logprobs)]
    print(
        f"{settings}: max |engine - trainer| = {worst:.2e}, mean |engine - raw| = {sum(raw_gaps) / len(raw_gaps):.3f}"
    )
    assert worst <= AGREEMENT_TOL
    if not settings.is_raw:
        assert sum(raw_gaps) / len(raw_gaps) >= MISMATCH_MIN, (
            "the transformation must matter for this check"
        )
