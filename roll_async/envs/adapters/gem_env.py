"""``gem:<env_id>``: a GEM (axon-rl/gem) env behind the project's text env contract.

GEM's envs are already text envs with the gym 5-tuple, so the adapter only puts GEM's
conventions where this contract expects them: the first observation (the game's
instructions) becomes ``info["instruction"]``, GEM's per-turn action suffix (``info["suffix"]``,
"Enter your next guess.") is appended to observations as GEM's own observation wrapper
does, and ``success`` is reported, which GEM leaves to the reward.
"""

from __future__ import annotations

import logging
from typing import Any

from roll_async.envs.adapters import import_optional, one_line, unknown_name_error
from roll_async.errors import ConfigError, EnvLibraryError, LifecycleError

#: The pip extra that installs GEM.
GEM_EXTRA = "roll-async[gem]"
#: gem-llm pins packages below the lock (pyproject's gem extra says which), so it goes in without its dependencies.
GEM_INSTALL = "pip install 'roll-async[gem]' && pip install --no-deps gem-llm==0.1.0"

#: Where a make or reset failure points (GEM's game envs that run offline; Wordle, Hangman and WordSearch
#: download NLTK word lists, the math/qa/code envs download datasets).
OFFLINE_HINT = (
    "if the env needs data or a network this machine lacks, install the data or use an offline GEM game: "
    "game:GuessTheNumber, Mastermind, Minesweeper, Sudoku, TowerofHanoi, Game2048, Sokoban, FifteenPuzzle, "
    "Crosswords (-v0-easy, -v0-hard)"
)

#: GEM's terminal observation of one-turn tasks (math, QA, code): nothing to show.
_TERMINAL_STATE = "<｜TERMINAL_STATE｜>"


class GemEnv:
    """A GEM env: ``gem.make(env_id, **env_config)`` builds it, so every option of GEM's env works as documented there.

    * Instruction: GEM's first observation (the rules and the answer format) is
      ``info["instruction"]``; the first observation is GEM's action suffix.
    * Observations: GEM's observation, then its suffix on a new line while the episode
      goes on (``add_suffix: false`` leaves the suffix out).
    * Actions: the model's whole reply goes to ``env.step`` (GEM's envs parse their own
      ``\\boxed{}`` syntax and reward a malformed reply themselves).
    * Rewards, ``terminated`` and ``truncated`` are GEM's.
    * ``success``: GEM's ``info["correct"]`` where the env reports it (math, QA, code),
      else ``terminated and reward >= success_reward`` (default 1.0, GEM's game success
      reward).

    GEM seeds Python's and NumPy's global random generators in ``reset``, so envs in one
    process's threads draw from one generator: a seed reproduces an episode exactly only
    with ``isolation: process``. Envs that need data from the network (Wordle, Hangman and
    WordSearch read NLTK word lists; the QA and math datasets download from a hub) fail
    in ``reset`` or when built; the error names the env_type and GEM's error.
    """

    def __init__(
        self,
        env_id: str,
        *,
        add_suffix: bool = True,
        success_reward: float = 1.0,
        **make_kwargs: Any,
    ) -> None:
        self.env_type = env_type = f"gem:{env_id}"
        gem = _import_gem(env_type)
        from gem.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            raise unknown_name_error("GEM", env_type, env_id, ENV_REGISTRY)
        try:
            self.env = gem.make(env_id, **make_kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"env_type {env_type!r}: gem.make rejected env_config {make_kwargs}: {one_line(exc)}"
            ) from None
        except Exception as exc:  # the env's own constructor: data it cannot load, a service it cannot reach
            raise EnvLibraryError(
                f"env_type {env_type!r}: gem.make({env_id!r}) raised {one_line(exc)}; {OFFLINE_HINT}"
            ) from exc
        self.env_id = env_id
        self.add_suffix = bool(add_suffix)
        self.success_reward = float(success_reward)
        self._suffix = ""
        self._done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        try:
            observation, info = self.env.reset(seed=int(seed))
        except Exception as exc:
            raise EnvLibraryError(
                f"env_type {self.env_type!r}: reset(seed={int(seed)}) raised {one_line(exc)}; {OFFLINE_HINT}"
            ) from exc
        info = info if isinstance(info, dict) else {}
        self._suffix = str(info.get("suffix") or "") if self.add_suffix else ""
        self._done = False
        return self._suffix, {"instruction": _text(observation), "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise LifecycleError(
                f"{self.env_type}: step() before reset() or after the episode ended; call reset()"
            )
        try:
            observation, reward, terminated, truncated, info = self.env.step(
                action_text
            )
        except Exception as exc:
            raise EnvLibraryError(
                f"env_type {self.env_type!r}: step raised {one_line(exc)}"
            ) from exc
        info = info if isinstance(info, dict) else {}
        reward = float(reward)
        terminated, truncated = bool(terminated), bool(truncated)
        self._done = terminated or truncated
        if self.add_suffix and info.get("suffix") is not None:
            self._suffix = str(info["suffix"])
        text = _text(observation)
        if self._suffix and not self._done:
            text = f"{text}\n{self._suffix}" if text else self._suffix
        success = (
            bool(info["correct"])
            if "correct" in info
            else terminated and reward >= self.success_reward
        )
        return text, reward, terminated, truncated, {"metrics": {"success": success}}

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _text(observation: Any) -> str:
    text = observation if isinstance(observation, str) else str(observation)
    return "" if text == _TERMINAL_STATE else text


def _import_gem(env_type: str) -> Any:
    """Import gem without its import-time ``logging.basicConfig(level=INFO)`` taking over this process's logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return import_optional("gem", "gem-llm", env_type, GEM_EXTRA, GEM_INSTALL)
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
