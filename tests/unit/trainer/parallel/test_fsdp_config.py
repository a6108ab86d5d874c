"""trainer.strategy / num_ranks / gpus_per_rank: bad combinations fail at load, and a cluster too small fails before any rank starts."""

from __future__ import annotations

import pytest

from roll_async.config.schema import TrainerConfig, load_config
from roll_async.errors import ConfigError
from roll_async.trainer.parallel.data_parallel import assign_to_ranks
from roll_async.trainer.ranks.rank_group import check_cluster_fits


def test_fsdp2_on_two_cpu_ranks_is_accepted():
    config = load_config(
        "configs/sokoban.yaml", ["trainer.strategy=fsdp2", "trainer.num_ranks=2"]
    )
    assert config.trainer.strategy == "fsdp2" and config.trainer.num_ranks == 2
    # a deadline on every call to the ranks by default
    assert config.trainer.rank_call_timeout_s == 3600.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.strategy=zero3"], r"trainer\.strategy='zero3' is unknown"),
        (
            ["trainer.num_ranks=2"],
            r"trainer\.num_ranks=2 .* need trainer\.strategy=fsdp2",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.num_ranks=0"],
            r"trainer\.num_ranks=0: must be >= 1",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.placement=ray_actor"],
            r"fsdp2 always runs its ranks as Ray actors",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.gpus_per_rank=2"],
            r"trainer\.gpus_per_rank=2.0: an fsdp2 rank drives one device",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.device=cuda"],
            r"trainer\.device='cuda' with trainer\.gpus_per_rank=0",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.simulate_step_s=1"],
            r"cannot be combined with trainer\.trainer_cls or trainer\.simulate_step_s",
        ),
        (
            ["trainer.strategy=fsdp2", "trainer.rank_call_timeout_s=-1"],
            r"trainer\.rank_call_timeout_s=-1\.0: must be >= 0 seconds; set it above the slowest healthy",
        ),
        (["checkpoint.export_hf_interval=-1"], r"checkpoint\.export_hf_interval=-1"),
        (
            [
                "trainer.strategy=fsdp2",
                "trainer.lora.rank=8",
                "trainer.lora.sync=merged",
            ],
            r"trainer\.lora\.sync=merged with trainer\.strategy=fsdp2: .* set trainer\.lora\.sync=adapter",
        ),
    ],
)
def test_bad_strategy_settings_fail_at_load_naming_key_and_fix(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config("configs/sokoban.yaml", overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "ranks, gpus, resources, message",
    [
        (4, 1.0, {"CPU": 64, "GPU": 2}, r"needs 4 GPU\(s\) but the Ray cluster has 2"),
        (3, 0.0, {"CPU": 2}, r"trainer\.num_ranks=3 needs 3 CPU\(s\)"),
    ],
)
def test_more_ranks_than_the_cluster_holds_is_a_one_line_error(
    ranks, gpus, resources, message
):
    config = TrainerConfig(strategy="fsdp2", num_ranks=ranks, gpus_per_rank=gpus)
    with pytest.raises(ConfigError, match=message):
        check_cluster_fits(config, resources)
    check_cluster_fits(config, {"CPU": 64, "GPU": 8})


def test_micro_batches_are_balanced_by_tokens_and_equal_on_every_rank():
    tokens = [500, 40, 40, 40, 300, 200, 10]
    shares = assign_to_ranks(tokens, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(tokens)))
    loads = [sum(tokens[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(tokens)
    assert shares == assign_to_ranks(list(tokens), 2)
    assert assign_to_ranks(tokens, 1) == [list(range(len(tokens)))]


def _checkpoint(root, *, sharded: bool, lora_rank: int = 0):
    import json

    step = root / "checkpoints" / "step_3"
    step.mkdir(parents=True)
    state = {"format": 1, "trainer_config": {"lora": {"rank": lora_rank}}}
    (step / "trainer_state.json").write_text(json.dumps(state))
    if sharded:
        (step / "dcp").mkdir()
        (step / "dcp" / ".metadata").write_bytes(b"")
    return root


@pytest.mark.parametrize(
    "sharded, lora_rank, overrides, message",
    [
        (
            False,
            0,
            ["trainer.strategy=fsdp2"],
            r"written by trainer\.strategy=single .* cannot reshard",
        ),
        (
            True,
            0,
            ["trainer.lora.rank=8"],
            r"holds full weights but this run has trainer\.lora\.rank=8",
        ),
        (
            False,
            8,
            [],
            r"holds LoRA adapters but this run has trainer\.lora\.rank=0; set trainer\.lora\.rank=8",
        ),
    ],
)
def test_resuming_into_a_strategy_that_cannot_load_the_checkpoint_fails_before_any_actor(
    tmp_path, sharded, lora_rank, overrides, message
):
    from roll_async.pipelines.preflight import check_resume_checkpoint

    run = _checkpoint(tmp_path, sharded=sharded, lora_rank=lora_rank)
    config = load_config(
        "configs/sokoban.yaml", [f"checkpoint.resume_from={run}", *overrides]
    )
    with pytest.raises(ConfigError, match=message) as info:
        check_resume_checkpoint(config)
    assert "\n" not in str(info.value)


def test_a_sharded_checkpoint_resumes_under_either_strategy(tmp_path):
    from roll_async.pipelines.preflight import check_resume_checkpoint

    run = _checkpoint(tmp_path, sharded=True)
    for overrides in ([], ["trainer.strategy=fsdp2", "trainer.num_ranks=3"]):
        check_resume_checkpoint(
            load_config(
                "configs/sokoban.yaml", [f"checkpoint.resume_from={run}", *overrides]
            )
        )
