"""custom_envs.<Tag>.seats: each bad seat list fails at load, before any actor, with one line naming the key."""

from __future__ import annotations

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.config.seat_rules import (
    SeatSpec,
    frozen_models,
    max_snapshot_lag,
    parse_seats,
    snapshot_engine_lags,
)
from roll_async.errors import ConfigError
from roll_async.pipelines.preflight import check_envs, import_user_code
from roll_async.pipelines.snapshot_engines import engine_lora_serving


def config_with(
    seats: list[str] | None,
    *,
    env_type: str = "tic_tac_toe",
    batch: int = 4,
    env_config: dict | None = None,
    **env_keys,
) -> PipelineConfig:
    return PipelineConfig(
        rollout_batch_size=batch,
        custom_envs={
            "Game": CustomEnvConfig(
                env_type=env_type,
                seats=seats or [],
                env_config=env_config or {},
                **env_keys,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["Game"]
        ),
    )


def load_checks(config: PipelineConfig) -> None:
    """What runs at load before any actor: the schema rules, then preflight's env checks."""
    validate_config(config)
    import_user_code(config)
    check_envs(config)


def test_seats_are_read_in_seat_order():
    assert parse_seats(
        "Game",
        [
            "policy",
            "random",
            "scripted:heuristic",
            "scripted:pkg.mod:fn",
            "frozen:tiny",
        ],
    ) == [
        SeatSpec(0, "policy"),
        SeatSpec(1, "scripted", "random"),
        SeatSpec(2, "scripted", "heuristic"),
        SeatSpec(3, "scripted", "pkg.mod:fn"),
        SeatSpec(4, "frozen", "tiny"),
    ]
    assert frozen_models(
        {
            "A": CustomEnvConfig(env_type="x", seats=["policy", "frozen:m1"]),
            "B": CustomEnvConfig(env_type="x", seats=["frozen:m2", "frozen:m1"]),
        },
        ["A", "B"],
    ) == ["m1", "m2"]
    assert parse_seats("Game", []) == []


@pytest.mark.parametrize(
    ("seats", "env_keys", "message"),
    [
        (
            ["policy", "frozen:"],
            {},
            r"^custom_envs\.Game\.seats\[1\]='frozen:': a frozen seat names its model",
        ),
        (
            ["policy", "snapshot:0"],
            {},
            r"^custom_envs\.Game\.seats\[1\]='snapshot:0': a snapshot seat names how many weight versions back",
        ),
        (
            ["policy", "scripted:"],
            {},
            r"^custom_envs\.Game\.seats\[1\]='scripted:': a scripted seat names",
        ),
        (
            ["policy", "robot"],
            {},
            r"^custom_envs\.Game\.seats\[1\]='robot' is not a seat",
        ),
        (
            ["policy"],
            {},
            r"^custom_envs\.Game\.seats lists 1 seat; a game has at least two",
        ),
        (
            ["random", "heuristic"],
            {},
            r"^custom_envs\.Game\.seats=.* has no policy seat",
        ),
        (
            ["policy", "random"],
            {"isolation": "process"},
            r"^custom_envs\.Game\.seats: games run in the worker's threads",
        ),
        (
            ["policy", "random"],
            {"service_url": "http://h:1"},
            r"^custom_envs\.Game\.seats: games run in the worker",
        ),
    ],
)
def test_a_seat_list_the_text_rules_out_fails_in_validate_config(
    seats, env_keys, message
):
    with pytest.raises(ConfigError, match=message) as caught:
        validate_config(config_with(seats, **env_keys))
    assert "\n" not in str(caught.value)


def test_rollout_batch_size_counts_trajectories_group_size_counts_games():
    with pytest.raises(
        ConfigError,
        match=r"^rollout_batch_size=2 is not a positive multiple of train_env_manager.group_size x policy seats=4",
    ):
        validate_config(config_with(["policy", "policy"], batch=2))
    spec = rollout_spec(config_with(["policy", "policy"], batch=8), "train")
    assert spec.groups_per_batch == 2  # 8 trajectories = 2 groups x 2 games x 2 seats
    assert (
        rollout_spec(
            config_with(["policy", "random"], batch=4), "train"
        ).groups_per_batch
        == 2
    )


@pytest.mark.parametrize(
    ("seats", "env_type", "env_config", "message"),
    [
        (
            ["policy", "random", "random"],
            "tic_tac_toe",
            {},
            r"^custom_envs\.Game\.env_type='tic_tac_toe' is a 2-player game, but 3 seats are configured; list 2",
        ),
        (
            ["policy", "policy"],
            "textarena:TicTacToe-v0",
            {"num_players": 3},
            r"^custom_envs\.Game\.env_type='textarena:TicTacToe-v0' is a 3-player game, but 2 seats",
        ),
        (
            ["policy", "scripted:no_such_module_xyz:play"],
            "tic_tac_toe",
            {},
            r"^custom_envs\.Game\.seats\[1\]='no_such_module_xyz:play': cannot import module 'no_such_module_xyz'",
        ),
        (
            ["policy", "frozen:/no/such/model"],
            "tic_tac_toe",
            {},
            r"^custom_envs\.Game\.seats\[1\]='frozen:/no/such/model': the model cannot be used",
        ),
        (
            ["policy", "heuristic"],
            "textarena:TicTacToe-v0",
            {},
            r"^custom_envs\.Game\.seats\[1\]=heuristic: 'textarena:TicTacToe-v0' has no built-in heuristic",
        ),
    ],
)
def test_a_seat_list_the_game_rules_out_fails_in_preflight(
    seats, env_type, env_config, message
):
    config = config_with(seats, env_type=env_type, env_config=env_config)
    with pytest.raises(ConfigError, match=message) as caught:
        load_checks(config)
    assert "\n" not in str(caught.value)


def test_a_random_seat_in_a_game_that_lists_no_legal_actions_fails_in_preflight():
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Game\.seats\[1\]=random: '.*:NoListGame' lists no legal actions",
    ):
        load_checks(
            config_with(
                ["policy", "random"],
                env_type="roll_async.testing.game_players:NoListGame",
            )
        )


def test_a_multi_player_game_without_seats_fails_in_preflight_naming_the_key():
    with pytest.raises(
        ConfigError,
        match=r"env_type='kuhn_poker' is a 2-player game, but 1 seat is configured; list who plays each of its 2 "
        r"seats in custom_envs.<Tag>.seats",
    ):
        load_checks(config_with(None, env_type="kuhn_poker", batch=2))


def test_a_good_game_tag_passes_the_load_checks():
    load_checks(config_with(["policy", "heuristic"], env_type="kuhn_poker"))
    load_checks(config_with(["frozen:tiny", "policy"], env_type="kuhn_poker"))
    load_checks(
        config_with(
            ["scripted:roll_async.testing.game_players:fails_once", "policy"],
            env_type="tic_tac_toe",
        )
    )


def lora_config(seats: list[str], max_steps: int) -> PipelineConfig:
    config = config_with(seats)
    config.max_steps = max_steps
    config.trainer.lora.rank = 8
    return config


def test_a_snapshot_the_run_never_reaches_fails_and_one_it_reaches_keeps_its_adapter_loaded():
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Game\.seats\[1\]='snapshot:5': this run makes 5 policy versions .* use k below 5",
    ):
        validate_config(lora_config(["policy", "snapshot:5"], max_steps=5))
    config = lora_config(["policy", "snapshot:4"], max_steps=5)
    validate_config(config)
    assert max_snapshot_lag(config.custom_envs, ["Game"]) == 4
    serving = engine_lora_serving(config, "unused")
    assert serving is not None and serving.max_loras == 5  # k + 1 versions loaded


def test_a_full_weight_run_takes_snapshot_seats_on_engines_of_their_own_and_refuses_a_k_it_never_reaches():
    config = config_with(["policy", "snapshot:5"])
    config.max_steps = 5
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Game\.seats\[1\]='snapshot:5': this run makes 5 policy versions .* use k below 5",
    ):
        validate_config(config)
    config.custom_envs["Game"].seats = ["snapshot:2", "policy"]
    validate_config(config)  # no LoRA needed
    assert engine_lora_serving(config, "unused") is None
    assert snapshot_engine_lags(config.custom_envs, ["Game"]) == [2]
    # a pool with the current policy: lag 0 plays on the policy's engines, each other lag gets one engine
    config.custom_envs["Game"].seats = ["pool", "snapshot:2", "policy"]
    config.custom_envs["Game"].pool.last_k = 3
    config.custom_envs["Game"].pool.include_current = True
    config.rollout_batch_size = 2
    validate_config(config)
    assert snapshot_engine_lags(config.custom_envs, ["Game"]) == [1, 2, 3]


def test_a_snapshot_only_an_unplayed_tag_would_need_does_not_refuse_the_run():
    config = config_with(["policy", "random"])
    config.custom_envs["Unplayed"] = CustomEnvConfig(
        env_type="tic_tac_toe", seats=["policy", "snapshot:5"]
    )
    config.max_steps = 5
    validate_config(
        config
    )  # configs/selfplay.yaml keeps tags a shortened run does not play
    config.train_env_manager.tags = ["Game", "Unplayed"]
    with pytest.raises(
        ConfigError, match=r"^custom_envs\.Unplayed\.seats\[1\]='snapshot:5'"
    ):
        validate_config(config)


def test_a_pool_needs_its_last_k_a_pool_seat_and_a_k_the_run_reaches():
    config = lora_config(["policy", "pool"], max_steps=5)
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Game\.seats\[1\]='pool': a pool seat draws from the last K policy versions; "
        r"set custom_envs\.Game\.pool\.last_k",
    ):
        validate_config(config)
    config.custom_envs["Game"].pool.last_k = 5
    with pytest.raises(
        ConfigError, match=r"seats\[1\]='pool': this run makes 5 policy versions"
    ):
        validate_config(config)
    config.custom_envs["Game"].pool.last_k = 3
    validate_config(config)
    assert engine_lora_serving(config, "unused").max_loras == 4
    config.custom_envs["Game"].seats = ["policy", "random"]
    with pytest.raises(
        ConfigError,
        match=r"^custom_envs\.Game\.pool\.last_k=3 but no seat plays from the pool",
    ):
        validate_config(config)


def test_random_sft_demos_need_a_game_as_the_first_train_tag():
    config = config_with(["policy", "random"])
    config.sft_warmup.enabled = True
    config.sft_warmup.demonstrator = "random"
    validate_config(config)  # a game: its random player demonstrates it
    config.custom_envs["Game"] = CustomEnvConfig(env_type="frozen_lake")
    with pytest.raises(
        ConfigError,
        match=r"^sft_warmup\.demonstrator=random: the demos play custom_envs\.Game .*demonstrator=expert$",
    ):
        validate_config(config)
