"""``roll-async train|rollout CONFIG --check`` passes on every shipped config, without starting Ray or vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roll_async.cli import main

REPO = Path(__file__).resolve().parents[2]
#: Included by the others (``defaults: [base]``), not a runnable config: it names no env.
INCLUDE_ONLY = {"base.yaml"}
CONFIGS = sorted(
    p for p in (REPO / "configs").glob("*.yaml") if p.name not in INCLUDE_ONLY
)


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_passes_the_check(
    config, capsys, monkeypatch, tiny_model_path
):
    # agent_frozen_lake names examples.agent_frozen_lake, run from the repo root
    monkeypatch.chdir(REPO)
    was_started = _ray_started()
    rc = main(["train", str(config), "--check"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith(f"OK {config}: train "), out
    assert _ray_started() == was_started


def test_rollout_check_and_a_broken_config_exits_one(capsys, tiny_model_path):
    sokoban = str(REPO / "configs" / "sokoban.yaml")
    assert main(["rollout", sokoban, "--check"]) == 0
    assert "rollout mode=sync" in capsys.readouterr().out
    assert main(["train", sokoban, "mode=asink", "--check"]) == 1
    assert "mode='asink' is unknown; use sync or async" in capsys.readouterr().err


def test_include_only_files_are_not_runnable(capsys):
    assert main(["train", str(REPO / "configs" / "base.yaml"), "--check"]) == 1
    assert "tags is empty" in capsys.readouterr().err


def test_an_error_in_user_code_prints_its_traceback_and_the_key(
    capsys, tmp_path, monkeypatch
):
    """Not a 'config error': the user's traceback, then one line naming the key; 1, where a config error is 2."""
    agent = tmp_path / "cli_agent_breaks.py"
    agent.write_text("import json\n\nSETTINGS = json.loads('{bad')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cli_agent_breaks", raising=False)
    config = tmp_path / "agent.yaml"
    config.write_text(
        "defaults: [agent_frozen_lake]\n"
        "custom_envs: {AgentFrozenLake: {agent: 'cli_agent_breaks:run'}}\n"
    )
    for argv, status in (([str(config), "--check"], 1), ([str(config)], 1)):
        assert main(["train", *argv]) == status
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):\n"), err
        assert f'File "{agent}", line 3, in <module>' in err
        assert "json.decoder.JSONDecodeError: Expecting property name" in err
        assert "config error" not in err
        assert (
            err.rstrip()
            .splitlines()[-1]
            .startswith(
                "roll-async: "
                + (f"{config}: " if "--check" in argv else "")
                + "error in user code: custom_envs.AgentFrozenLake.agent='cli_agent_breaks:run': "
                "importing module 'cli_agent_breaks' raised JSONDecodeError: Expecting property name"
            )
        )
    config.write_text(
        "defaults: [agent_frozen_lake]\n"
        "custom_envs: {AgentFrozenLake: {agent: 'cli_agent_brakes:run'}}\n"
    )
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "roll-async: config error: custom_envs.AgentFrozenLake.agent="
    )
    assert "Traceback" not in err
