"""LoRA end to end on CPU with the real engine: adapter-only training, and the engine follows each adapter sync.

The engine serves each synced adapter as a vLLM LoRA request (trainer.lora.sync=adapter, the default).
After every sync its logprobs of what it samples for a fixed prompt must equal the trainer's logprobs of
the same tokens with the trainer's current adapter (and differ from the base model's), while the base
weights never change; a request running across a sync keeps the adapter it started with.
"""

from __future__ import annotations

import asyncio
import glob
import uuid
from pathlib import Path

import pytest

from roll_async.config.schema import EngineConfig, load_config
from roll_async.trajectory import GenerationRequest
from tests.integration.short_runs import IN_PROCESS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: A LoRA run's trainer: rank 8, and a learning rate at which the adapter moves within a few steps.
LORA = ["trainer.lr=2e-2", "trainer.lora.rank=8", "trainer.lora.alpha=32"]
#: |engine - trainer| logprob bound on sampled tokens (as test_train_pipeline: float32 CPU kernels).
LOGPROB_TOL = 2e-3


def lora_config(tmp_path: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "sokoban.yaml",
        [
            f"output_dir={tmp_path}",
            "mode=sync",
            *IN_PROCESS,
            *LORA,
            "max_steps=3",
            "custom_envs.SimpleSokoban.max_steps=2",
            "custom_envs.SimpleSokoban.max_tokens_per_step=16",
            "checkpoint.save_interval=1",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
async def lora_engine(ray_session, tiny_model_path):
    """An engine replica serving LoRA adapters (its own: the session's engine has LoRA off)."""
    from roll_async.engine.engine_actor import launch_engines, shutdown_engines
    from roll_async.engine.lora_adapters import LoraServing
    from roll_async.trainer.lora import adapter_config_json

    config = lora_config(Path("/tmp"))
    serving = LoraServing(
        rank=config.trainer.lora.rank,
        max_loras=2,
        adapter_config=adapter_config_json(config.trainer.lora, str(tiny_model_path)),
    )
    (actor,) = await launch_engines(
        str(tiny_model_path),
        EngineConfig(
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=16,
            cpu_kv_cache_space_gib=0.5,
        ),
        name_prefix="test_lora_engine",
        lora=serving,
    )
    yield actor
    await shutdown_engines([actor])


def fixed_prompt(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": "Push the box.\n######\n#_P_X_#"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def trainer_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


async def test_lora_run_trains_only_adapters_and_the_engine_follows_each_sync(
    lora_engine, tokenizer, tiny_model_path, tmp_path
):
    from safetensors.torch import load_file

    from roll_async.pipelines.agentic_pipeline import AgenticPipeline
    from roll_async.trainer.lora import adapters_off

    # the SFT warm start trains the adapter too: the engine must serve it from the first sync on
    config = lora_config(
        tmp_path,
        "sft_warmup.enabled=true",
        "sft_warmup.steps=10",
        "sft_warmup.num_demos=8",
        "sft_warmup.lr=2e-2",
    )
    pipeline = AgenticPipeline(config, engines=[lora_engine])
    prompt = fixed_prompt(tokenizer)
    checks: list[dict] = []
    push = pipeline._push_weights

    async def push_and_compare(
        version: int, in_flight: str, start: bool = False
    ) -> float:
        spent = await push(version, in_flight, start)
        sampled = await lora_engine.generate.remote(
            GenerationRequest(
                request_id=f"lora-check-{version}-{uuid.uuid4().hex[:6]}",
                prompt_token_ids=prompt,
                max_tokens=16,
                temperature=1.0,
                seed=7,
                ignore_eos=True,
            )
        )
        model = pipeline.trainer.model
        tokens = sampled.output_token_ids
        with adapters_off(model):
            base = trainer_logprobs(model, prompt, tokens)
        checks.append(
            {
                "version": version,
                "engine": sampled.logprobs,
                "trainer": trainer_logprobs(model, prompt, tokens),
                "base": base,
                "token_versions": sampled.token_versions,
            }
        )
        return spent

    pipeline._push_weights = push_and_compare
    run = await pipeline.run()

    # the warm-started adapter first (version 0), then one sync per step
    assert [c["version"] for c in checks] == [0, 1, 2, 3]
    for check in checks:
        assert check["token_versions"] == [check["version"]] * 16
        assert check["engine"] == pytest.approx(check["trainer"], abs=LOGPROB_TOL)
        assert (
            max(abs(e - b) for e, b in zip(check["engine"], check["base"]))
            > 10 * LOGPROB_TOL
        ), "the engine serves the base model, not the adapter"
    # only adapter weights trained: every base weight is still the model file's
    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    base_model = pipeline.trainer.model.get_base_model()
    for name, tensor in base_model.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        if plain in original:
            assert (tensor == original[plain]).all(), plain
    checkpoint = run / "checkpoints" / "step_2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists()
    assert await lora_engine.lora_versions.remote() == [
        2,
        3,
    ]  # max_loras newest versions


async def test_a_request_running_across_a_sync_keeps_its_adapter_version(
    lora_engine, tokenizer, tiny_model_path
):
    import torch

    from roll_async.config.schema import LoraConfig, TrainerConfig
    from roll_async.trainer import GRPOTrainer

    trainer = GRPOTrainer(
        TrainerConfig(device="cpu", lora=LoraConfig(rank=8, alpha=32)), tiny_model_path
    )
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    version = int(await lora_engine.get_weight_version.remote())
    await lora_engine.pause.remote("wait")
    await lora_engine.update_weights.remote(
        trainer.state_dict_for_engine(), version + 1
    )
    await lora_engine.resume.remote()
    long = asyncio.ensure_future(
        lora_engine.generate.remote(
            GenerationRequest(
                request_id=f"lora-long-{uuid.uuid4().hex[:6]}",
                prompt_token_ids=fixed_prompt(tokenizer),
                max_tokens=400,
                temperature=1.0,
                seed=1,
                ignore_eos=True,
            )
        )
    )
    for _ in range(200):
        if (await lora_engine.stats.remote())["in_flight"] >= 1:
            break
        await asyncio.sleep(0.02)
    assert not long.done()
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    await lora_engine.pause.remote("keep")
    await lora_engine.update_weights.remote(
        trainer.state_dict_for_engine(), version + 2
    )
    await lora_engine.resume.remote()
    result = await long
    assert len(result.output_token_ids) == 400
    assert (
        result.token_versions == [version + 1] * 400
    )  # sampled by the adapter it started on
    after = await lora_engine.generate.remote(
        GenerationRequest(
            request_id=f"lora-after-{uuid.uuid4().hex[:6]}",
            prompt_token_ids=fixed_prompt(tokenizer),
            max_tokens=4,
            temperature=1.0,
            seed=1,
        )
    )
    assert set(after.token_versions) == {version + 2}
    assert await lora_engine.lora_versions.remote() == [version + 1, version + 2]


async def test_lora_on_two_fsdp_ranks_keeps_the_engine_on_the_trained_adapter(
    lora_engine, ray_session, tmp_path
):
    from roll_async.pipelines.agentic_pipeline import AgenticPipeline
    from roll_async.trainer.ranks.rank_group import TrainerRankGroup
    from tests.integration.test_train_pipeline import read_jsonl

    # each sync sends the adapter the ranks gathered; with only current-version tokens scored, the
    # trainer's and the engine's probabilities agree (ratio 1) only if the engine serves that adapter
    config = lora_config(
        tmp_path,
        "trainer.strategy=fsdp2",
        "trainer.num_ranks=2",
        "trainer.max_token_lag=0",
    )
    pipeline = AgenticPipeline(config, engines=[lora_engine])
    run = await pipeline.run()
    assert isinstance(pipeline.trainer, TrainerRankGroup)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # step 0 samples with whatever adapter the shared engine last served (an earlier test's)
    for m in metrics[1:]:
        assert m["train/importance_ratio/max"] == pytest.approx(1.0, abs=1e-2)
        assert m["train/importance_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    checkpoint = run / "checkpoints" / "step_2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "dcp" / ".metadata").is_file()


async def test_a_snapshot_seat_plays_the_policy_one_adapter_back(lora_engine, tmp_path):
    """``snapshot:1`` in a LoRA run: every game trains 3 steps against the policy one adapter back (sync)
    and against a pool of the current policy and the one adapter back (async); a request with
    ``adapter_lag`` 1 runs on the older of the two adapters loaded, one with lag 0 on the newest (the
    versions its tokens carry). The tiny model rarely makes a legal move, so
    these adapters stay near equal: this checks which adapter runs, not that they differ.
    """
    import json

    from roll_async.pipelines.agentic_pipeline import AgenticPipeline
    from tests.integration.test_selfplay_train import GAMES, assert_games, games

    pytest.importorskip("textarena")
    for mode in ("sync", "async"):
        config = load_config(
            REPO / "configs" / "selfplay.yaml",
            [
                f"output_dir={tmp_path / mode}",
                "max_steps=3",
                *IN_PROCESS,
                f"mode={mode}",
                *(["max_staleness=1"] if mode == "async" else []),
                # a batch is every game's group: one trained seat x 2 games per tag
                f"rollout_batch_size={len(GAMES) * 2}",
                *LORA,
                # async: a pool of the current policy (k 0, untrained) and the policy one adapter back
                *(
                    games("[snapshot:1,policy]")
                    if mode == "sync"
                    else [
                        *games("[pool,policy]"),
                        *(f"custom_envs.{tag}.pool.last_k=1" for tag in GAMES),
                        *(
                            f"custom_envs.{tag}.pool.include_current=true"
                            for tag in GAMES
                        ),
                    ]
                ),
            ],
        )
        run = await AgenticPipeline(config, engines=[lora_engine]).run()
        trajectories = [
            json.loads(line)
            for line in (run / "trajectories.jsonl").read_text().splitlines()
        ]
        assert len(trajectories) == 3 * len(GAMES) * 2
        assert_games(trajectories, {"seat1"})
        assert {t["tag"] for t in trajectories} == set(GAMES), mode
        if mode == "sync":
            assert {t["opponents"] for t in trajectories} == {"snapshot"}
        else:
            assert {t["opponents"] for t in trajectories} == {"pool"}
            lags = {t["metrics"]["game_pool_lag_seat0"] for t in trajectories}
            assert lags <= {0.0, 1.0} and trajectories
    loaded = await lora_engine.lora_versions.remote()
    assert len(loaded) == 2
    prompt = list(range(10, 40))
    outputs = [
        await lora_engine.generate.remote(
            GenerationRequest(
                request_id=f"snapshot-check-{lag}-{uuid.uuid4().hex[:6]}",
                prompt_token_ids=prompt,
                max_tokens=8,
                temperature=1.0,
                seed=3,
                ignore_eos=True,
                adapter_lag=lag,
            )
        )
        for lag in (0, 1)
    ]
    # the engine labels a LoRA request's tokens with the adapter version it ran on
    assert outputs[0].token_versions == [loaded[1]] * 8
    assert outputs[1].token_versions == [loaded[0]] * 8


async def test_a_frozen_opponent_plays_on_an_engine_of_its_own_whose_weights_stay_put(
    engine, lora_engine, tmp_path
):
    """``frozen:<model>``: the policy trains on the session's engine while its opponent plays on another.

    The opponent's engine is this module's LoRA engine serving its base weights (no adapter), so no
    engine is started for it; the pipeline never syncs weights to it.
    """
    from tests.integration.test_selfplay_train import assert_games, train

    before = await lora_engine.get_weight_version.remote()
    prompt_tokens = (await lora_engine.stats.remote())["prompt_tokens"]
    trajectories = await train(
        engine,
        tmp_path / "frozen",
        2,
        "rollout_batch_size=2",
        "custom_envs.KuhnPoker.seats=[frozen:tiny,policy]",
        opponents={"tiny": [lora_engine]},
    )
    assert_games(trajectories, {"seat1"})
    assert {t["opponents"] for t in trajectories} == {"frozen"}
    assert await lora_engine.get_weight_version.remote() == before
    # seat 0 moves first: every game sent the frozen model at least one request
    assert (await lora_engine.stats.remote())["prompt_tokens"] > prompt_tokens
