"""The foundation demo: tiny model → engine actor → one batch of env chat prompts → tokens/s.

It exercises the real path (Ray-hosted vLLM, token ids in and out) before any
rollout loop exists, and prints one line a user can compare across machines.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from roll_async.config.schema import PipelineConfig
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.envs import make_env
from roll_async.model.paths import resolve_model_path
from roll_async.prompts.images import observation_text
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.runtime.ray_utils import init_ray
from roll_async.trajectory import GenerationRequest


def env_prompt_ids(
    config: PipelineConfig, tokenizer: ChatTokenizer, num_prompts: int
) -> list[list[int]]:
    """First-turn prompt ids of the configured train tags, one per seed, built as EnvManagers build them."""
    tags = config.train_env_manager.tags
    prompts = []
    for index in range(num_prompts):
        spec = config.custom_envs[tags[index % len(tags)]]
        env = make_env(spec.env_type, dict(spec.env_config))
        observation, info = env.reset(seed=config.seed + index)
        env.close()
        user = spec.instruction_template.format(
            instruction=info.get("instruction", ""),
            observation=observation_text(observation),
        )
        prompts.append(
            ChatPromptBuilder.for_model(
                tokenizer, config.model, spec.system_prompt
            ).first_turn_ids(user)
        )
    return prompts


async def _generate_batch(
    config: PipelineConfig, num_prompts: int, max_tokens: int
) -> dict[str, float]:
    import ray
    from transformers import AutoTokenizer

    model_path = resolve_model_path(config.model.path)
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, trust_remote_code=config.model.trust_remote_code
    )
    prompts = env_prompt_ids(config, tokenizer, num_prompts)
    init_ray(config.ray_address, config.ray_num_cpus)
    t0 = time.perf_counter()
    engines = await launch_engines(model_path, config.engine)
    startup_s = time.perf_counter() - t0
    try:
        requests = [
            GenerationRequest(
                request_id=f"demo-{uuid.uuid4().hex[:8]}-{i}",
                prompt_token_ids=ids,
                max_tokens=min(max_tokens, config.engine.max_model_len - len(ids)),
                temperature=config.generation.temperature,
                top_p=config.generation.top_p,
                seed=config.seed + i,
            )
            for i, ids in enumerate(prompts)
        ]
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(
                engines[i % len(engines)].generate.remote(req)
                for i, req in enumerate(requests)
            )
        )
        elapsed = time.perf_counter() - t0
    finally:
        await shutdown_engines(engines)
        ray.shutdown()
    generated = sum(len(r.output_token_ids) for r in results)
    sample = tokenizer.decode(results[0].output_token_ids)
    print(f"model: {model_path}")
    print(
        f"engine start: {startup_s:.1f}s; prompts: {len(prompts)} (mean {sum(map(len, prompts)) / len(prompts):.0f} tokens)"
    )
    print(f"sample output: {sample[:120]!r}")
    print(
        f"generated {generated} tokens in {elapsed:.2f}s: {generated / elapsed:.1f} tokens/s"
    )
    return {
        "tokens_per_s": generated / elapsed,
        "generated_tokens": generated,
        "elapsed_s": elapsed,
    }


def run_generate_demo(
    config: PipelineConfig, num_prompts: int = 64, max_tokens: int = 64
) -> dict[str, float]:
    return asyncio.run(_generate_batch(config, num_prompts, max_tokens))
