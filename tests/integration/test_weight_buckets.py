"""Weights in buckets through the object store (put once, shared by replicas) load exactly like a state dict."""

from __future__ import annotations

import glob
import uuid

import pytest

from roll_async.engine.weight_transport import pack_weight_buckets, put_buckets
from roll_async.trajectory import GenerationRequest

pytestmark = pytest.mark.integration


def greedy_request(prompt: list[int], request_id: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"{request_id}-{uuid.uuid4().hex[:8]}",
        prompt_token_ids=prompt,
        max_tokens=16,
        temperature=0.0,
        ignore_eos=True,
    )


async def test_bucketed_object_store_weights_equal_the_state_dict_path(
    engine, tokenizer, tiny_model_path
):
    import torch
    from safetensors.torch import load_file

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Move the box."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    generator = torch.Generator().manual_seed(1)
    perturbed = {
        k: v + 0.5 * torch.randn(v.shape, generator=generator)
        for k, v in original.items()
    }
    buckets = pack_weight_buckets(
        perturbed, bucket_bytes=64 << 10
    )  # small buckets: several per model
    assert len(buckets) > 2
    version = await engine.get_weight_version.remote()
    try:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(
            perturbed, version + 1
        )  # the reference path: a state dict
        await engine.resume.remote()
        by_dict = await engine.generate.remote(greedy_request(prompt, "by-dict"))
        await engine.pause.remote("wait")
        await engine.update_weights.remote(original, version + 2)
        await engine.update_weights.remote(
            put_buckets(buckets), version + 3
        )  # refs, fetched bucket by bucket
        await engine.resume.remote()
        by_buckets = await engine.generate.remote(greedy_request(prompt, "by-buckets"))
        assert by_buckets.output_token_ids == by_dict.output_token_ids
        assert by_buckets.weight_version == version + 3
    finally:
        await engine.pause.remote("wait")
        await engine.update_weights.remote(original, version + 4)
        await engine.resume.remote()


def test_a_tensor_larger_than_the_bucket_is_a_bucket_of_its_own():
    import torch
    from safetensors.torch import load

    weights = {"a": torch.zeros(10), "big": torch.zeros(1000), "c": torch.ones(10)}
    buckets = pack_weight_buckets(weights, bucket_bytes=100)
    loaded = [load(b) for b in buckets]
    assert [sorted(b) for b in loaded] == [["a"], ["big"], ["c"]]
    assert torch.equal(loaded[2]["c"], torch.ones(10))
