"""The real vLLM engine (CPU) behind its Ray actor: the guarantees every rollout relies on."""

from __future__ import annotations

import asyncio
import glob
import time
import uuid

import pytest

from roll_async.trajectory import GenerationRequest

pytestmark = pytest.mark.integration


def _req(prompt: list[int], **kwargs) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"t-{uuid.uuid4().hex[:10]}", prompt_token_ids=prompt, **kwargs
    )


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    messages = [
        {
            "role": "system",
            "content": "You are an agent. Reply with your action inside <answer></answer>.",
        },
        {
            "role": "user",
            "content": "Move the box onto the target.\n#####\n#P_O#\n#__X#\n#####",
        },
    ]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


async def test_many_concurrent_generates_each_get_their_tokens(engine, prompt):
    requests = [
        _req(prompt, max_tokens=8 + i % 8, seed=i, ignore_eos=True) for i in range(48)
    ]
    results = await asyncio.gather(*(engine.generate.remote(r) for r in requests))
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    for req, res in zip(requests, results):
        assert len(res.output_token_ids) == req.max_tokens
        assert res.finish_reason == "length"
        assert res.num_prompt_tokens == len(prompt)


async def test_logprobs_match_outputs_and_are_valid(engine, prompt):
    res = await engine.generate.remote(_req(prompt, max_tokens=24, seed=3))
    assert len(res.logprobs) == len(res.output_token_ids) > 0
    assert all(lp <= 0.0 for lp in res.logprobs)
    no_lp = await engine.generate.remote(
        _req(prompt, max_tokens=4, seed=3, logprobs=False, ignore_eos=True)
    )
    assert no_lp.logprobs == [] and len(no_lp.output_token_ids) == 4


async def test_greedy_is_deterministic(engine, prompt):
    a, b = await asyncio.gather(
        engine.generate.remote(
            _req(prompt, max_tokens=16, temperature=0.0, ignore_eos=True)
        ),
        engine.generate.remote(
            _req(prompt, max_tokens=16, temperature=0.0, ignore_eos=True)
        ),
    )
    assert a.output_token_ids == b.output_token_ids


async def test_seeded_sampling_is_reproducible(engine, prompt):
    a = await engine.generate.remote(
        _req(prompt, max_tokens=16, seed=1234, ignore_eos=True)
    )
    b = await engine.generate.remote(
        _req(prompt, max_tokens=16, seed=1234, ignore_eos=True)
    )
    assert a.output_token_ids == b.output_token_ids


async def test_stop_string_ends_generation_and_ids_contain_it(
    engine, prompt, tokenizer
):
    # Find a stop string the random model will produce: the decoded text of a sampled continuation.
    probe = await engine.generate.remote(
        _req(prompt, max_tokens=12, seed=7, ignore_eos=True)
    )
    text = tokenizer.decode(probe.output_token_ids)
    stop = text[len(text) // 2 :][:2] or text[-1:]
    assert stop.strip() or stop
    res = await engine.generate.remote(
        _req(prompt, max_tokens=12, seed=7, ignore_eos=True, stop=[stop])
    )
    assert res.finish_reason == "stop"
    decoded = tokenizer.decode(res.output_token_ids)
    assert stop in decoded, (
        "the stop string must be kept in the output ids (token-in/token-out)"
    )
    assert len(res.output_token_ids) < len(probe.output_token_ids)
    assert res.output_token_ids == probe.output_token_ids[: len(res.output_token_ids)]


async def test_abort_returns_partial_tokens_with_finish_reason_abort(engine, prompt):
    req = _req(prompt, max_tokens=900 - len(prompt), ignore_eos=True, seed=5)
    ref = engine.generate.remote(req)
    await asyncio.sleep(0.5)
    await engine.abort.remote([req.request_id])
    res = await ref
    assert res.finish_reason == "abort"
    assert len(res.output_token_ids) < req.max_tokens
    assert len(res.logprobs) == len(res.output_token_ids)


async def test_pause_abort_wait_keep_and_resume(engine, prompt):
    long = dict(max_tokens=600, ignore_eos=True)
    # abort: in-flight requests end at once with finish_reason abort
    ref = engine.generate.remote(_req(prompt, **long))
    await asyncio.sleep(0.3)
    await engine.pause.remote("abort")
    assert (await ref).finish_reason == "abort"
    # while paused, new requests queue instead of running
    queued = engine.generate.remote(_req(prompt, max_tokens=4, ignore_eos=True))
    done, _ = await asyncio.wait(
        [asyncio.ensure_future(asyncio.wrap_future(queued.future()))], timeout=1.0
    )
    assert not done, "a request ran while the engine was paused"
    await engine.resume.remote()
    assert len((await queued).output_token_ids) == 4
    # keep: in-flight requests freeze and finish after resume
    ref = engine.generate.remote(_req(prompt, max_tokens=200, ignore_eos=True))
    await asyncio.sleep(0.2)
    await engine.pause.remote("keep")
    await asyncio.sleep(0.5)
    await engine.resume.remote()
    kept = await ref
    assert kept.finish_reason == "length" and len(kept.output_token_ids) == 200
    # wait: pause returns only after in-flight requests completed normally
    ref = engine.generate.remote(_req(prompt, max_tokens=64, ignore_eos=True))
    await asyncio.sleep(0.1)
    await engine.pause.remote("wait")
    waited = await ref
    await engine.resume.remote()
    assert waited.finish_reason == "length" and len(waited.output_token_ids) == 64
    with pytest.raises(ValueError, match="pause mode"):
        await engine.pause.remote("sometimes")


async def test_update_weights_changes_greedy_output_and_bumps_version(
    engine, prompt, tiny_model_path
):
    import torch
    from safetensors.torch import load_file

    greedy = dict(max_tokens=16, temperature=0.0, ignore_eos=True)
    before = await engine.generate.remote(_req(prompt, **greedy))
    version = await engine.get_weight_version.remote()
    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    generator = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator)
        for k, v in original.items()
    }
    try:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(perturbed, version + 1)
        await engine.resume.remote()
        after = await engine.generate.remote(_req(prompt, **greedy))
        assert after.output_token_ids != before.output_token_ids
        assert after.weight_version == version + 1
        assert (await engine.stats.remote())["weight_version"] == version + 1
        with pytest.raises(ValueError, match="older"):
            await engine.update_weights.remote(original, version)
    finally:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(original, version + 2)
        await engine.resume.remote()
    restored = await engine.generate.remote(_req(prompt, **greedy))
    assert restored.output_token_ids == before.output_token_ids


async def test_stats_count_tokens(engine, prompt):
    before = await engine.stats.remote()
    await asyncio.gather(
        *(
            engine.generate.remote(_req(prompt, max_tokens=5, ignore_eos=True))
            for _ in range(4)
        )
    )
    after = await engine.stats.remote()
    assert after["generation_tokens"] - before["generation_tokens"] == 20
    assert after["prompt_tokens"] - before["prompt_tokens"] == 4 * len(prompt)
    assert {"running", "waiting", "kv_cache_usage"} <= set(after)


async def test_stats_count_engine_steps_and_what_they_carried(engine, prompt):
    """Per-step counters split tokens/s into steps/s x tokens per step (benchmarks/env_grouping.py)."""
    before = await engine.stats.remote()
    await asyncio.gather(
        *(
            engine.generate.remote(_req(prompt, max_tokens=5, ignore_eos=True))
            for _ in range(4)
        )
    )
    deadline = time.monotonic() + 10
    # the step's stats are recorded just after its outputs are handed to the callers
    while True:
        after = await engine.stats.remote()
        generated = (
            after["engine_step_generation_tokens"]
            - before["engine_step_generation_tokens"]
        )
        if generated >= 20 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    steps = after["engine_steps"] - before["engine_steps"]
    assert generated == 20
    # one token per request per step: at least 5 steps, at most one request per step
    assert 5 <= steps <= 20
    assert after["engine_step_prompt_tokens"] - before[
        "engine_step_prompt_tokens"
    ] == 4 * len(prompt)
    assert (
        1
        <= (after["engine_step_running_sum"] - before["engine_step_running_sum"])
        / steps
        <= 4
    )


async def test_request_longer_than_max_model_len_is_a_clear_error(
    engine, prompt, engine_config
):
    with pytest.raises(ValueError, match="max_model_len"):
        await engine.generate.remote(
            _req(prompt, max_tokens=engine_config.max_model_len)
        )
    # the engine keeps serving after a rejected request
    ok = await engine.generate.remote(_req(prompt, max_tokens=2, ignore_eos=True))
    assert len(ok.output_token_ids) == 2


async def test_updated_weights_are_served_exactly_including_the_tied_output_head(
    engine, prompt, tiny_model_path
):
    """Engine logprobs after an update equal Hugging Face's for the same weights.

    Only the (tied) input embedding changes: on CPU vLLM pre-packs the output head at load
    time, so an update that is not re-processed keeps sampling from the old head.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    generator = torch.Generator().manual_seed(1)
    changed = dict(original)
    changed["model.embed_tokens.weight"] = original[
        "model.embed_tokens.weight"
    ] + 0.3 * torch.randn(
        original["model.embed_tokens.weight"].shape, generator=generator
    )
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, torch_dtype=torch.float32
    )
    reference.load_state_dict(changed, strict=False)
    reference.tie_weights()
    version = await engine.get_weight_version.remote()
    try:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(
            {"model.embed_tokens.weight": changed["model.embed_tokens.weight"]},
            version + 1,
        )
        await engine.resume.remote()
        sampled = await engine.generate.remote(
            _req(prompt, max_tokens=16, seed=11, ignore_eos=True)
        )
    finally:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(original, version + 2)
        await engine.resume.remote()
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + sampled.output_token_ids])).logits[
            0, len(prompt) - 1 : -1
        ]
        expected = torch.log_softmax(logits, dim=-1).gather(
            1, torch.tensor(sampled.output_token_ids)[:, None]
        )[:, 0]
    assert expected.tolist() == pytest.approx(sampled.logprobs, abs=2e-3)
