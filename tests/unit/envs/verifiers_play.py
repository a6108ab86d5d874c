"""Helpers of the verifiers tests: a one-tag config, one episode on a fake engine through the real gateway."""

from __future__ import annotations

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.env_managers.env_manager import EnvManager
from roll_async.env_managers.worker import build_env_managers
from roll_async.testing.fake_engine import FakeEngine
from roll_async.trajectory import EpisodeSpec, Trajectory


def verifiers_config(
    env_type: str, env_config: dict | None = None, max_steps: int = 4
) -> PipelineConfig:
    config = PipelineConfig(
        sequence_length=512,
        rollout_batch_size=1,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Vf": CustomEnvConfig(
                env_type=env_type,
                env_config=env_config or {},
                max_steps=max_steps,
                max_tokens_per_step=16,
            )
        },
        train_env_manager=EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Vf"]),
    )
    validate_config(config)
    return config


async def play(
    config: PipelineConfig, engine: FakeEngine, tokenizer, seed: int
) -> tuple[Trajectory, EnvManager]:
    (manager,) = build_env_managers(
        rollout_spec(config, "train"),
        [(0, "Vf")],
        scheduler=None,
        engine_for=lambda _: engine,
        tokenizer=tokenizer,
    )
    try:
        spec = EpisodeSpec(
            tag="Vf", group_id=1, episode_id=0, seed=seed, created_step=0
        )
        return await manager._run_episode(spec), manager
    finally:
        await manager.agent_gateway.stop()


def replying(tokenizer, *texts: str) -> FakeEngine:
    """A fake engine whose n-th call answers ``texts[n]`` (then EOS)."""
    outputs = [
        tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]
        for t in texts
    ]
    engine = FakeEngine()
    engine._output_fn = lambda request: outputs[len(engine.requests) - 1]
    return engine
