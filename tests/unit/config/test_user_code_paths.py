"""User code named by a config path: its own errors are shown as themselves, a wrong path stays a config error.

``resolve_dotted`` imports the module a ``package.module:attr`` path names. An exception the module raises
while it runs is the user's (``UserCodeError`` from the original, naming the config key, with the user's
frames in its traceback); a module or attribute that is not there is a one-line ``ConfigError`` with a
did-you-mean; an import on the main thread keeps roll-async's SIGINT/SIGTERM handlers.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from roll_async.config.dotted_paths import calling_user_code, resolve_dotted
from roll_async.errors import ConfigError, InvalidInputError, UserCodeError

KEY = "custom_envs.Agent.agent='{path}'"


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Write ``name.py`` modules into tmp_path, importable for this test only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        written.append(name)
        return path

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_a_module_raising_at_import_is_shown_as_itself_with_the_key_and_its_traceback(
    user_modules,
):
    source = user_modules(
        "uc_raises_at_import",
        """
        def _table():
            return {}["missing"]

        TABLE = _table()

        async def run(client, task):
            return 1.0
        """,
    )
    path = "uc_raises_at_import:run"
    with pytest.raises(UserCodeError) as info:
        resolve_dotted(path, KEY.format(path=path))
    error = info.value
    assert not isinstance(error, ConfigError)
    assert isinstance(error.__cause__, KeyError) and error.original is error.__cause__
    assert str(error).startswith(
        f"{KEY.format(path=path)}: importing module 'uc_raises_at_import' raised KeyError: 'missing'"
    )
    shown = error.user_traceback()
    assert shown.startswith("Traceback (most recent call last):\n")
    assert f'File "{source}", line 5, in <module>' in shown  # TABLE = _table()
    assert f'File "{source}", line 3, in _table' in shown
    assert "dotted_paths.py" not in shown and "importlib" not in shown
    assert shown.rstrip().endswith("KeyError: 'missing'")


def test_an_import_of_its_own_that_fails_is_the_modules_error_not_a_wrong_path(
    user_modules,
):
    user_modules("uc_needs_a_dependency", "import no_such_dependency_xyz\n")
    with pytest.raises(
        UserCodeError,
        match="ModuleNotFoundError: No module named 'no_such_dependency_xyz'",
    ):
        resolve_dotted("uc_needs_a_dependency:Env", "custom_envs.T.env_type")


def test_a_wrong_path_stays_a_one_line_config_error_with_a_did_you_mean(user_modules):
    user_modules("uc_plain_module", "class GuessEnv:\n    pass\n")
    with pytest.raises(ConfigError) as info:
        resolve_dotted("uc_plain_modul:GuessEnv", "custom_envs.T.env_type")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "custom_envs.T.env_type: cannot import module 'uc_plain_modul': No module named 'uc_plain_modul'."
    )
    assert "Did you mean 'uc_plain_module'?" in message
    with pytest.raises(
        ConfigError,
        match=r"has no attribute 'GuesEnv'\. Did you mean 'GuessEnv'\?$",
    ):
        resolve_dotted("uc_plain_module:GuesEnv", "custom_envs.T.env_type")
    with pytest.raises(ConfigError, match="Did you mean 'roll_async.envs.sokoban'"):
        resolve_dotted("roll_async.envs.sokobn:SokobanEnv", "custom_envs.T.env_type")


def test_a_sigint_handler_set_at_import_on_the_main_thread_is_undone(
    user_modules, caplog
):
    user_modules(
        "uc_sets_sigint",
        """
        import signal

        def _quit(signum, frame):
            raise SystemExit(0)

        signal.signal(signal.SIGINT, _quit)

        class Env:
            pass
        """,
    )
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT)
    try:
        resolve_dotted("uc_sets_sigint:Env", "custom_envs.T.env_type")
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, before)
    assert (
        "importing 'uc_sets_sigint' set a SIGINT handler; roll-async put its own back"
        in caplog.text
    )


def test_off_the_main_thread_a_module_setting_a_handler_fails_as_its_own_error(
    user_modules,
):
    """Why preflight imports user modules on the main thread: elsewhere ``signal.signal`` raises."""
    user_modules(
        "uc_sets_sigterm",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n",
    )
    caught: list[BaseException] = []

    def import_it() -> None:
        try:
            resolve_dotted("uc_sets_sigterm:x", "custom_envs.T.env_type")
        except BaseException as exc:  # handed to the test's thread
            caught.append(exc)

    thread = threading.Thread(target=import_it)
    thread.start()
    thread.join()
    assert len(caught) == 1 and isinstance(caught[0], UserCodeError)
    assert "raised ValueError: signal only works in main thread" in str(caught[0])


def test_calling_user_code_wraps_its_errors_and_lets_roll_asyncs_own_pass():
    with pytest.raises(
        UserCodeError, match=r"^k: calling reset\(seed=1\) raised ZeroDivisionError"
    ):
        with calling_user_code("k", "reset(seed=1)"):
            1 / 0  # noqa: B018
    with pytest.raises(InvalidInputError):
        with calling_user_code("k", "reset(seed=1)"):
            raise InvalidInputError("roll-async's own check")
