"""Weight-version truth on the real CPU engine: after an update in any pause mode no KV computed under the
old weights is reused, and every generated token carries the version of the weights that sampled it.

Proof by two independent signals: vLLM's per-request prefix-cache hits (``prefix_cache_hit_tokens``)
and the logprobs themselves, compared with Hugging Face scoring under the old and the new weights
(a stale prefix or a wrong version label shows as a logprob gap of whole nats, the check's noise is ~1e-6).
"""

from __future__ import annotations

import asyncio
import glob
import uuid

import pytest

from roll_async.trajectory import GenerationRequest

pytestmark = pytest.mark.integration

#: Largest |engine - HF| logprob accepted as "computed by these weights" (noise measured ~1e-6).
SAME_WEIGHTS_TOL = 2e-3


def _req(prompt: list[int], **kwargs) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"wv-{uuid.uuid4().hex[:10]}", prompt_token_ids=prompt, **kwargs
    )


@pytest.fixture(scope="module")
def cached_prompt(tokenizer) -> list[int]:
    """A prompt of several full KV blocks (CPU block size 128), so the prefix cache has something to hit."""
    text = " ".join(f"Room {i}: #__P_O_X# the box is at {i % 7}." for i in range(40))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert len(ids) >= 300
    return ids[:400]


@pytest.fixture(scope="module")
def running_prompt(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": "Keep going for a long time."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


@pytest.fixture(scope="module")
def weights(tiny_model_path):
    """(original, perturbed) state dicts and HF models for each."""
    import torch
    from safetensors.torch import load_file

    from roll_async.trainer.model_loading import load_causal_lm

    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    generator = torch.Generator().manual_seed(7)
    perturbed = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator)
        for k, v in original.items()
    }
    old_model = load_causal_lm(str(tiny_model_path), torch.float32, torch.device("cpu"))
    new_model = load_causal_lm(str(tiny_model_path), torch.float32, torch.device("cpu"))
    new_model.load_state_dict(perturbed, strict=False)
    new_model.tie_weights()
    return original, perturbed, old_model, new_model


def _gaps(model, prompt: list[int], result) -> list[float]:
    from roll_async.trainer.scoring import score_generated_tokens

    scored = score_generated_tokens(model, prompt, result.output_token_ids)
    return [abs(a - b) for a, b in zip(scored, result.logprobs)]


async def _wait_until_running(engine, deadline_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while (await engine.stats.remote())["running"] < 1:
        assert loop.time() < end, "the long request never started"
        await asyncio.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
async def test_no_stale_prefix_after_an_update_and_every_token_tagged_with_its_version(
    engine, weights, cached_prompt, running_prompt, mode
):
    original, perturbed, old_model, new_model = weights
    greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    await engine.generate.remote(_req(cached_prompt, **greedy))
    before = (await engine.stats.remote())["prefix_cache_hit_tokens"]
    await engine.generate.remote(_req(cached_prompt, **greedy))
    assert (await engine.stats.remote())["prefix_cache_hit_tokens"] - before >= 256, (
        "control: the cache hits"
    )

    version = await engine.get_weight_version.remote()
    # A long request in flight while the update happens; in keep mode it is frozen holding KV blocks.
    long = engine.generate.remote(_req(running_prompt, max_tokens=500, ignore_eos=True))
    try:
        await _wait_until_running(engine)
        await asyncio.sleep(0.3)  # let it sample some tokens under the old weights
        await engine.pause.remote(mode)
        await engine.update_weights.remote(perturbed, version + 1)
        await engine.resume.remote()
        spanning = await long

        before = (await engine.stats.remote())["prefix_cache_hit_tokens"]
        fresh = await engine.generate.remote(_req(cached_prompt, **greedy))
        assert (await engine.stats.remote())["prefix_cache_hit_tokens"] == before, (
            "a prefix of old weights was reused"
        )
        assert fresh.token_versions == [version + 1] * 8
        assert max(_gaps(new_model, cached_prompt, fresh)) <= SAME_WEIGHTS_TOL
    finally:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(original, version + 2)
        await engine.resume.remote()

    tokens = spanning.output_token_ids
    assert len(spanning.token_versions) == len(tokens) > 0
    old_gaps, new_gaps = (
        _gaps(old_model, running_prompt, spanning),
        _gaps(new_model, running_prompt, spanning),
    )
    if mode == "keep":
        n_old = spanning.token_versions.count(version)
        assert 0 < n_old < len(tokens) == 500, (
            "a keep-mode request spanning the update has two versions"
        )
        assert spanning.token_versions == [version] * n_old + [version + 1] * (
            len(tokens) - n_old
        )
        assert spanning.finish_reason == "length"
        # Each token's logprob is that of the weights its version names: the frozen request's KV was
        # recomputed under the new weights (a stale KV would put the new-version tokens nats off).
        assert max(old_gaps[:n_old]) <= SAME_WEIGHTS_TOL
        assert max(new_gaps[n_old:]) <= SAME_WEIGHTS_TOL
    else:
        assert spanning.token_versions == [version] * len(tokens)
        assert spanning.finish_reason == ("abort" if mode == "abort" else "length")
        assert max(old_gaps) <= SAME_WEIGHTS_TOL
