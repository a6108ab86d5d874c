"""The shipped tool-using configs train end to end on the real CPU engine with the zoo Qwen2.5 (``tiny-qwen2_5``).

``configs/retrieval_qa_tools.yaml`` and ``configs/code_tools.yaml`` (envs that declare function tools,
``action_format: tools``) each roll out and train 2 steps, and ``configs/agent_tool_calling.yaml`` (an
agent declaring a tool through the OpenAI client) trains one, all with small batches on one engine for
the zoo model that the runs share (each run gives it the trainer's weights first). ``configs/swe.yaml``
(a shell agent in Docker containers) trains 2 steps and must leave no container of its run. A random-init
model rarely writes a well-formed call, so the checks are on what every step must show: whole batches,
a finite loss, weight versions rising by one, tool-call counters reported and token-exact ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll_async.config.schema import EngineConfig, load_config
from roll_async.model.paths import resolve_model_path
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.testing.workspace_runtimes import skip_reason
from roll_async.workspaces.docker import connect
from roll_async.workspaces.docker_reaper import count_run
from tests.integration.short_runs import IN_PROCESS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMMON = IN_PROCESS


#: config name -> the run id of its last run here (the label its workspace containers carried).
RUN_IDS: dict[str, str] = {}


@pytest.fixture(scope="module")
async def zoo_engine(ray_session):
    """One Ray engine actor on the zoo Qwen2.5 (``model.path: tiny-qwen2_5``), shared by this module's runs."""
    from roll_async.engine.engine_actor import launch_engines, shutdown_engines

    config = EngineConfig(
        dtype="float32", max_model_len=2048, max_num_seqs=64, cpu_kv_cache_space_gib=1.0
    )
    (actor,) = await launch_engines(
        resolve_model_path("tiny-qwen2_5"), config, name_prefix="tools_engine"
    )
    yield actor
    await shutdown_engines([actor])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def train(name: str, engine, tmp_path: Path, steps: int, *overrides: str):
    config = load_config(
        REPO / "configs" / f"{name}.yaml",
        [f"output_dir={tmp_path / name}", f"max_steps={steps}", *COMMON, *overrides],
    )
    assert config.model.path == "tiny-qwen2_5"
    pipeline = AgenticPipeline(config, engines=[engine])
    run = await pipeline.run()
    RUN_IDS[name] = pipeline.run_id
    # step -1: warm-up metrics; step == steps: the run's end (e.g. workspace/containers_leaked)
    metrics = [m for m in read_jsonl(run / "metrics.jsonl") if 0 <= m["step"] < steps]
    assert [m["step"] for m in metrics] == list(range(steps))
    versions = [m["weight_version"] for m in metrics]
    assert versions == [versions[0] + s for s in range(steps)]
    assert all(m["train/loss"] is not None for m in metrics), metrics
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 4 * steps
    return metrics, trajectories


@pytest.mark.timeout(600)
async def test_env_tool_configs_train_two_steps(zoo_engine, tmp_path):
    first_tool_name = {"retrieval_qa_tools": "search", "code_tools": "run_python"}
    for name, tag, tokens in (
        ("retrieval_qa_tools", "RetrievalQATools", 24),
        ("code_tools", "CodeTools", 48),
    ):
        metrics, trajectories = await train(
            name,
            zoo_engine,
            tmp_path,
            2,
            f"custom_envs.{tag}.max_steps=2",
            f"custom_envs.{tag}.max_tokens_per_step={tokens}",
        )
        assert {t["tag"] for t in trajectories} == {tag}
        assert not [t for t in trajectories if t["stop_reason"] == "env_error"], [
            t.get("error") for t in trajectories
        ]
        # The tools are declared once, through the template, with the system prompt; the counters are reported.
        system = (
            load_config(REPO / "configs" / f"{name}.yaml")
            .custom_envs[tag]
            .system_prompt
        )
        tool = first_tool_name[name]
        for trajectory in trajectories:
            assert trajectory["text"].count(system) == 1
            assert trajectory["text"].count(f'"name": "{tool}"') == 1
        for step in metrics:
            assert {
                f"env/{tag}/agent_tool_calls",
                f"env/{tag}/agent_tool_parse_errors",
                "rollout/agent_tool_calls",
            } <= set(step)


@pytest.mark.timeout(300)
async def test_agent_tool_calling_config_trains(zoo_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the agent is examples.agent_tool_calling
    _, trajectories = await train(
        "agent_tool_calling",
        zoo_engine,
        tmp_path,
        1,
        "custom_envs.AgentToolCalling.max_steps=2",
        "custom_envs.AgentToolCalling.max_tokens_per_step=16",
    )
    assert {t["tag"] for t in trajectories} == {"AgentToolCalling"}
    for trajectory in trajectories:
        assert trajectory["stop_reason"] != "env_error", trajectory["error"]
        # Both calls extend one token-exact segment that declares the tool and the system prompt once.
        assert trajectory["metrics"]["agent_calls"] == 2.0
        assert trajectory["metrics"]["agent_segments"] == 1.0
        assert trajectory["text"].count('"name": "move"') == 1
        assert trajectory["text"].count("Reach the goal.") == 1


@pytest.mark.timeout(600)
async def test_swe_config_trains_in_containers_and_leaves_none(zoo_engine, tmp_path):
    """configs/swe.yaml (runtime: docker) trains 2 steps; its containers carry the run's label and none is left."""
    reason = skip_reason("docker")
    if reason:
        pytest.skip(reason)
    metrics, trajectories = await train(
        "swe",
        zoo_engine,
        tmp_path,
        2,
        # the env ends (and verifies) at its own max_steps: keep it the tag's
        "custom_envs.Swe.max_steps=2",
        "custom_envs.Swe.env_config.max_steps=2",
        "custom_envs.Swe.max_tokens_per_step=48",
        "sequence_length=2048",
        "engine.max_model_len=2048",
    )
    assert not [t for t in trajectories if t["stop_reason"] == "env_error"], [
        t.get("error") for t in trajectories
    ]
    for step in metrics:
        assert {
            "env/Swe/workspace_start_s",
            "env/Swe/workspace_pool_hit",
            "env/Swe/exec_p99_s",
            "env/Swe/verifier_seconds",
            "env/Swe/workspaces_alive",
        } <= set(step), sorted(k for k in step if k.startswith("env/Swe"))
    end = read_jsonl(tmp_path / "swe" / "metrics.jsonl")[-1]
    assert end["step"] == 2 and end["workspace/containers_leaked"] == 0
    assert count_run(connect(30.0), RUN_IDS["swe"]) == 0
