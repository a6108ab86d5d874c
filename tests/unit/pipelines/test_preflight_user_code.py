"""Preflight imports user code on the main thread and shows its errors as themselves, naming the config key.

An env class or agent module (written into tmp_path here, as a user's would be) that raises while it is
imported or called is a ``UserCodeError`` with the user's traceback, not a config error; one that sets a
SIGINT handler at import time does not take Ctrl-C from roll-async's interrupt handling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError, UserCodeError
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.pipelines.interrupt import InterruptFlag, SignalReceived
from roll_async.pipelines.preflight import check_envs, import_user_code

REPO = Path(__file__).resolve().parents[3]

#: A user env module: it sets a SIGINT handler at import (as some libraries do) and records the thread it
#: was imported on and the SIGINT handler its reset saw; reset raises when the env_config says so.
ENV_MODULE = """
import signal
import threading

IMPORTED_ON = threading.current_thread()
SEEN_BY_RESET = []

def _users_handler(signum, frame):
    SEEN_BY_RESET.append("the user's handler ran")

signal.signal(signal.SIGINT, _users_handler)

class GuessEnv:
    def __init__(self, fail: bool = False):
        self.fail = fail

    def reset(self, seed):
        SEEN_BY_RESET.append(signal.getsignal(signal.SIGINT))
        if self.fail:
            raise RuntimeError("the user's reset failed")
        return "Guess.", {"instruction": "Reply <answer>N</answer>."}

    def step(self, text):
        return "done", 1.0, True, False, {}
"""


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Write ``name.py`` modules into tmp_path, importable for this test only; SIGINT's handler is restored."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []
    previous = signal.getsignal(signal.SIGINT)

    def write(name: str, source: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        written.append(name)
        return path

    yield write
    signal.signal(signal.SIGINT, previous)
    for name in written:
        sys.modules.pop(name, None)


def _config(tmp_path: Path, env_type: str, *overrides: str):
    config_file = tmp_path / "user.yaml"
    config_file.write_text(
        textwrap.dedent(f"""
            defaults: [base]
            custom_envs:
              Guess:
                env_type: {env_type}
                max_steps: 2
            train_env_manager: {{tags: [Guess], num_env_groups: 1, group_size: 2}}
            rollout_batch_size: 2
        """)
    )
    return load_config(config_file, list(overrides))


def test_an_env_raising_in_reset_is_a_user_code_error_naming_the_key(
    tmp_path, user_modules
):
    source = user_modules("pf_env_reset_fails", ENV_MODULE)
    config = _config(
        tmp_path,
        "pf_env_reset_fails:GuessEnv",
        "custom_envs.Guess.env_config.fail=true",
    )
    with pytest.raises(UserCodeError) as info:
        check_envs(config)
    assert str(info.value).startswith(
        "custom_envs.Guess.env_type='pf_env_reset_fails:GuessEnv': calling reset(seed=42) raised "
        "RuntimeError: the user's reset failed"
    )
    shown = info.value.user_traceback()
    assert f'File "{source}"' in shown and ", in reset" in shown
    assert "preflight.py" not in shown


def test_an_agent_module_raising_at_import_names_the_agent_key(tmp_path, user_modules):
    source = user_modules(
        "pf_agent_breaks",
        """
        LIMIT = int("ten")

        async def run(client, task):
            return 1.0
        """,
    )
    config = _config(
        tmp_path,
        "agent",
        "custom_envs.Guess.agent=pf_agent_breaks:run",
    )
    with pytest.raises(UserCodeError) as info:
        import_user_code(config)
    assert str(info.value).startswith(
        "custom_envs.Guess.agent='pf_agent_breaks:run': importing module 'pf_agent_breaks' raised "
        "ValueError: invalid literal for int() with base 10: 'ten'"
    )
    assert f'File "{source}", line 2, in <module>' in info.value.user_traceback()


def test_a_wrong_env_path_is_still_a_one_line_config_error(tmp_path, user_modules):
    user_modules("pf_env_exists", ENV_MODULE)
    config = _config(tmp_path, "pf_env_exists:GuesEnv")
    with pytest.raises(ConfigError) as info:
        import_user_code(config)
    assert str(info.value) == (
        "custom_envs.Guess.env_type='pf_env_exists:GuesEnv': module 'pf_env_exists' has no attribute "
        "'GuesEnv'. Did you mean 'GuessEnv'?"
    )


async def test_a_sigint_handler_set_at_import_leaves_roll_asyncs_ctrl_c_in_place(
    tmp_path, user_modules
):
    user_modules("pf_env_takes_sigint", ENV_MODULE)
    config = _config(tmp_path, "pf_env_takes_sigint:GuessEnv")
    flag = InterruptFlag().install()
    try:
        ours = signal.getsignal(signal.SIGINT)
        import_user_code(config)
        assert signal.getsignal(signal.SIGINT) is ours
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        with pytest.raises(SignalReceived):
            await flag.race(asyncio.sleep(3600))
    finally:
        flag.uninstall()
    module = sys.modules["pf_env_takes_sigint"]
    assert flag.signal_name == "SIGINT"
    assert "the user's handler ran" not in module.SEEN_BY_RESET


async def test_the_train_pipeline_imports_user_modules_on_the_main_thread(
    tmp_path, user_modules
):
    """Preflight runs in a worker thread, where a module's ``signal.signal`` would raise ValueError; the
    pipeline imports user modules on the loop's (main) thread first and keeps its own SIGINT handler."""
    user_modules("pf_env_in_train", ENV_MODULE)
    config = _config(
        tmp_path,
        "pf_env_in_train:GuessEnv",
        "custom_envs.Guess.env_config.fail=true",
        "logging.console=false",
        f"output_dir={tmp_path / 'runs'}",
    )
    try:
        with pytest.raises(
            UserCodeError, match=r"calling reset\(seed=42\) raised RuntimeError"
        ):
            await AgenticPipeline(config).run(handle_signals=True)
    finally:
        for handler in list(
            logging.getLogger().handlers
        ):  # the run's driver.log, if it got that far
            if getattr(handler, "_roll_async_file", False):
                logging.getLogger().removeHandler(handler)
                handler.close()
    module = sys.modules["pf_env_in_train"]
    assert module.IMPORTED_ON is threading.main_thread()
    seen_in_preflight = module.SEEN_BY_RESET[0]
    assert seen_in_preflight is not module._users_handler
    assert not (tmp_path / "runs").exists()  # preflight failed before the run directory
