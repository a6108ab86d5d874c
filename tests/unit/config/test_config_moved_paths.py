"""A config that names a module by its path before the one-package layout fails at load with the new path."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "override, new",
    [
        (
            "custom_envs.Sokoban.env_type=env_managers.testing:ScriptedEnv",
            "roll_async.testing.scripted_envs:ScriptedEnv",
        ),
        (
            "trainer.trainer_cls=roll_async.trainer.placement:TrainerActor",
            "roll_async.trainer.trainer_actor:TrainerActor",
        ),
    ],
)
def test_an_old_module_path_fails_at_load_naming_the_new_one(override, new):
    with pytest.raises(ConfigError, match=f"moved: use '{new}'"):
        load_config(REPO / "configs" / "sokoban.yaml", [override])


def test_an_old_agent_path_names_the_new_test_aid_module():
    with pytest.raises(ConfigError, match="roll_async.testing.agents:three_turn_agent"):
        load_config(
            REPO / "configs" / "agent_frozen_lake.yaml",
            ["custom_envs.AgentFrozenLake.agent=env_managers.testing:three_turn_agent"],
        )
