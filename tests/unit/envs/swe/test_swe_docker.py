"""``env_type: swe`` on the docker runtime through the rollout: a container that dies mid-episode is an env error.

A container killed while the agent's command runs (as the OOM killer or a lost node would end it) must
cost that one trajectory, not the run: the env raises WorkspaceError, the env manager records the episode
as ``env_error`` (counted, its seat re-opened and played again), the dead container is removed, and
every container of the run is gone once the scheduler shut down. The envs of the worker share one runtime.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
)
from roll_async.config.validation import validate_config
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.workspace_runtimes import (
    docker_problem,
    kill_container_running,
    skip_reason,
)
from roll_async.trajectory import GenerationRequest
from roll_async.workspaces.docker import connect
from roll_async.workspaces.docker_reaper import count_run
from roll_async.workspaces.shared import shared_runtimes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        skip_reason("docker") is not None, reason=str(skip_reason("docker"))
    ),
]
#: The agent's first command: long enough for the test to find it and kill its container.
WORK = "sleep 2.5"


def _config(run_id: str) -> PipelineConfig:
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=2,
        sequence_length=2048,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Swe": CustomEnvConfig(
                env_type="swe",
                env_config={
                    "runtime": "docker",
                    "runtime_config": {"run_id": run_id, "pool_size": 1},
                    "action_format": "text",
                    "task_format": "swe",
                    "task_ids": ["roll-async__calc_add"],
                    "command_timeout_s": 20,
                },
                max_steps=3,
                max_tokens_per_step=64,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2, group_size=1, tags=["Swe"], env_step_timeout_s=60
        ),
    )
    validate_config(config)
    return config


async def test_a_container_killed_mid_episode_is_an_env_error_and_the_run_goes_on() -> (
    None
):
    assert docker_problem() is None, docker_problem()
    tokenizer = build_chatml_test_tokenizer()
    run_id = f"test-envfail-{uuid.uuid4().hex[:8]}"

    def reply(request: GenerationRequest) -> list[int]:
        seen = tokenizer.decode(request.prompt_token_ids)
        text = (
            "```bash\nsubmit\n```" if "[exit code" in seen else f"```bash\n{WORK}\n```"
        )
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids + [tokenizer.eos_token_id]

    scheduler = LocalRolloutScheduler(
        rollout_spec(_config(run_id), "train"),
        engines=FakeEngine(reply),
        tokenizer=tokenizer,
    )
    api: Any = connect(30.0)
    try:
        await scheduler.start()
        killer = asyncio.ensure_future(kill_container_running(run_id, WORK))
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(0), 240
        )
        killed = await killer
    finally:
        await scheduler.shutdown()
    assert metrics["rollout/env_errors"] == 1
    assert [t.stop_reason for t in batch] == ["terminated", "terminated"]
    failed = [t for fate, t in scheduler.last_unserved if fate == "env_error"]
    assert len(failed) == 1 and killed[:12] in failed[0].error, failed
    # the episodes that ran on got their workspace metrics
    assert all(
        "workspace_start_s" in t.metrics and "exec_p99_s" in t.metrics for t in batch
    )
    assert not api.containers(all=True, filters={"id": killed})
    assert count_run(api, run_id) == 0 and shared_runtimes() == 0
