"""make_env / register_env: names, dotted paths to outside envs, config key validation, async envs."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from roll_async.envs import (
    BaseEnv,
    SokobanEnv,
    env_is_async,
    make_env,
    register_env,
    registered_envs,
    registry,
)
from roll_async.errors import ConfigError

BUILTIN_NAMES = {
    "sokoban",
    "frozen_lake",
    "sliding_puzzle",
    "countdown",
    "retrieval_qa",
}


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_builtins_are_registered_and_config_is_applied():
    assert BUILTIN_NAMES <= set(registered_envs())
    env = make_env("sokoban", {"dim_room": [7, 8], "num_boxes": 2})
    assert (
        isinstance(env, SokobanEnv)
        and env.config.dim_room == (7, 8)
        and env.config.num_boxes == 2
    )
    assert make_env("countdown", None).config.num_numbers == 4


def test_unknown_env_type_lists_registered_names():
    with pytest.raises(ValueError) as e:
        make_env("sokobon", {})
    for name in BUILTIN_NAMES:
        assert name in str(e.value)


def test_unknown_config_key_names_key_and_accepted_keys():
    with pytest.raises(ValueError) as e:
        make_env("sokoban", {"dim_rooms": [6, 6]})
    msg = str(e.value)
    assert (
        "'dim_rooms'" in msg
        and "dim_room" in msg
        and "num_boxes" in msg
        and "format_penalty" in msg
    )


def test_custom_env_outside_the_package_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_envs_pkg").mkdir()
    (tmp_path / "my_envs_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_envs_pkg" / "echo.py").write_text(
        textwrap.dedent('''
        from dataclasses import dataclass
        from roll_async.envs import BaseEnv, EnvConfig

        @dataclass
        class EchoConfig(EnvConfig):
            word: str = "ping"

        class EchoEnv(BaseEnv):
            """Say the word to win."""
            config_cls = EchoConfig
            def _reset(self, seed):
                pass
            def _apply(self, action):
                self.success = self.done = action.strip() == self.config.word
                return float(self.success), True, ""
            def render_text(self):
                return "Say the word."
            def instruction(self):
                return "Reply " + self.parser.wrap(self.config.word)

        class PlainEnv:
            """Not derived from BaseEnv: config keys come from the constructor."""
            def __init__(self, size: int = 3):
                self.size = size
            def reset(self, seed):
                return "x" * self.size, {}
            def step(self, action_text):
                return "", 1.0, True, False, {"metrics": {}}
    ''')
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("my_envs_pkg.echo:EchoEnv", {"word": "pong"})
    _, info = env.reset(0)
    assert info["instruction"] == "Reply <answer>pong</answer>"
    _, r, term, _, info = env.step("<answer>pong</answer>")
    assert (r, term, info["metrics"]["success"]) == (1.0, True, True)
    with pytest.raises(ValueError, match="'wrd'.*word"):
        make_env("my_envs_pkg.echo:EchoEnv", {"wrd": "x"})
    assert make_env("my_envs_pkg.echo:PlainEnv", {"size": 5}).reset(0)[0] == "xxxxx"
    with pytest.raises(ValueError, match="'width'.*accepted keys: size"):
        make_env("my_envs_pkg.echo:PlainEnv", {"width": 5})


def test_dotted_path_errors_say_what_failed():
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        make_env("no_such_module_xyz:Env", {})
    with pytest.raises(ValueError, match="has no attribute 'NoSuchEnv'"):
        make_env("roll_async.envs.sokoban:NoSuchEnv", {})
    with pytest.raises(ValueError, match="not a class"):
        make_env("roll_async.envs.sokoban:MOVES", {})


def test_register_env_and_conflicts(clean_registry):
    class Mine(SokobanEnv):
        pass

    register_env("mine", Mine)
    assert isinstance(make_env("mine", {"num_boxes": 1}), Mine)
    register_env("mine", Mine)  # same class again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_env("mine", SokobanEnv)
    register_env("mine", SokobanEnv, overwrite=True)
    with pytest.raises(TypeError, match="no reset, step"):
        register_env("broken", object)

    @register_env("decorated")
    class Decorated(Mine):
        pass

    assert "decorated" in registered_envs() and Decorated.__name__ == "Decorated"


def test_async_envs_are_detected_and_awaitable(clean_registry):
    class AsyncEcho:
        async def reset(self, seed: int):
            return f"seed {seed}", {"instruction": "say hi"}

        async def step(self, action_text: str):
            await asyncio.sleep(0)
            return (
                "",
                1.0,
                True,
                False,
                {
                    "metrics": {
                        "action_is_valid": True,
                        "action_is_effective": True,
                        "success": True,
                    }
                },
            )

    register_env("async_echo", AsyncEcho)
    env = make_env("async_echo", {})
    assert env_is_async(env) and not env_is_async(make_env("sokoban", {}))

    async def run():
        obs, _ = await env.reset(3)
        return obs, await env.step("hi")

    obs, (_, reward, term, _, _) = asyncio.run(run())
    assert obs == "seed 3" and reward == 1.0 and term


def test_construction_is_cheap_and_lazy():
    """Building an env does no generation or corpus loading; reset does."""
    env = make_env("retrieval_qa", {})
    assert env.bm25 is None and isinstance(env, BaseEnv)
    env.reset(0)
    assert env.bm25 is not None


def test_a_verifiers_env_type_is_an_agent_session_not_an_env_class():
    env_type = "verifiers:some_env"
    assert not registry.names_user_class(env_type)  # not imported as pkg.module:Class
    with pytest.raises(ConfigError, match="played as an agent session"):
        make_env(env_type, {})
