"""``gymnasium:<EnvId>``: a gymnasium env with a discrete action space, played in text.

Users with a gymnasium env should not have to port it: the adapter builds it
with ``gymnasium.make`` (every gymnasium option works as documented there),
renders its observations as text and reads its actions from the model's reply
with the shared action parser.
"""

from __future__ import annotations

import re
from typing import Any

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.envs.adapters import import_optional, unknown_name_error
from roll_async.envs.parsing import ActionParser
from roll_async.errors import ConfigError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: unwrapped env class name -> action names in action-index order.
ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLakeEnv": ("Left", "Down", "Right", "Up"),
    "TaxiEnv": ("South", "North", "East", "West", "Pickup", "Dropoff"),
    "CliffWalkingEnv": ("Up", "Right", "Down", "Left"),
    "BlackjackEnv": ("Stick", "Hit"),
}

_RULES: dict[str, str] = {
    "FrozenLakeEnv": (
        "You are on a frozen lake. Walk from S to the goal G without falling into a hole H; F is safe ice and "
        "P marks where you are. Reaching G gives reward 1."
    ),
    "TaxiEnv": (
        "You drive a taxi on a 5x5 grid (':' is open, '|' is a wall). Pick the passenger up at their stop "
        "(R, G, Y or B) and drop them off at the destination stop. Each move costs 1, a delivery earns 20, "
        "an illegal pickup or drop-off costs 10."
    ),
    "CliffWalkingEnv": (
        "Walk from the start to the target T on a grid without stepping on the cliff C; x marks where you are. "
        "Each move costs 1 and the cliff costs 100 and sends you back to the start."
    ),
    "BlackjackEnv": (
        "You play Blackjack against the dealer. Get a hand total closer to 21 than the dealer without going over. "
        "Hit takes a card, Stick ends your turn. Winning gives +1, losing -1, a draw 0."
    ),
}


class GymnasiumEnv:
    """A gymnasium env behind the project's text env contract.

    The env is built by ``gymnasium.make(env_id, **env_config)`` (``render_mode``
    defaults to ``ansi`` where the env has it), so every gymnasium option
    (``is_slippery``, ``map_name``, ``max_episode_steps``, ...) works as written in
    gymnasium's docs. Adapter keys, not forwarded: ``action_pattern`` (default
    ``<answer>(.*?)</answer>``) and ``format_penalty`` (default -0.1).

    The observation is text: for FrozenLake, Taxi, CliffWalking and Blackjack a
    description written for them (grid with the player marked, taxi and passenger
    positions, hand totals); for any other env its ``ansi`` render with the colour
    codes removed, or the raw observation. The action vocabulary is the env's own
    action names (FrozenLake ``Left Down Right Up``, Taxi ``South North East West
    Pickup Dropoff``, CliffWalking ``Up Right Down Left``, Blackjack ``Stick Hit``;
    other ``Discrete(n)`` envs: ``0`` .. ``n-1``), parsed from the reply by the
    shared :class:`~roll_async.envs.parsing.ActionParser`. A reply with no valid
    action does not step the env: it costs ``format_penalty`` and the observation
    repeats with the reason. Rewards, ``terminated`` and ``truncated`` are the env's.
    """

    def __init__(
        self,
        env_id: str,
        *,
        action_pattern: str = r"<answer>(.*?)</answer>",
        format_penalty: float = -0.1,
        **make_kwargs: Any,
    ) -> None:
        gym = import_optional("gymnasium", "gymnasium", f"gymnasium:{env_id}")
        self.env_id = env_id
        self.format_penalty = float(format_penalty)
        try:
            spec = gym.spec(env_id)
        except gym.error.Error as exc:
            if isinstance(exc, gym.error.DeprecatedEnv):
                raise ConfigError(f"env_type 'gymnasium:{env_id}': {exc}") from None
            raise unknown_name_error(
                "gymnasium", f"gymnasium:{env_id}", env_id, gym.registry
            ) from None
        kwargs = dict(make_kwargs)
        if "render_mode" not in kwargs and "ansi" in (_render_modes(spec) or ()):
            kwargs["render_mode"] = "ansi"
        try:
            self.env = gym.make(env_id, **kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"env_type 'gymnasium:{env_id}': gymnasium.make rejected env_config {make_kwargs}: {exc}"
            ) from None
        space = self.env.action_space
        if not isinstance(space, gym.spaces.Discrete):
            self.env.close()
            raise ConfigError(
                f"env_type 'gymnasium:{env_id}' has action space {space}; the gymnasium adapter plays Discrete "
                "action spaces (FrozenLake, Taxi, CliffWalking, Blackjack, ...)"
            )
        self.kind = type(self.env.unwrapped).__name__
        names = ACTION_NAMES.get(self.kind)
        if names is None or len(names) != int(space.n):
            names = tuple(str(int(space.start) + i) for i in range(int(space.n)))
        self.action_names = names
        self.parser = ActionParser(
            pattern=action_pattern, separator="", max_actions=1, valid_actions=names
        )
        self._obs: Any = None
        self.invalid_actions = 0

    # -- the env contract --------------------------------------------------------------

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._obs, _ = self.env.reset(seed=int(seed))
        self.invalid_actions = 0
        return self.render(), {"instruction": self.instruction(), "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self.parser.parse(action_text)
        if not parsed.is_valid:
            self.invalid_actions += 1
            feedback = f"Invalid action: {parsed.error}. Valid actions: {', '.join(self.action_names)}."
            metrics = {
                "action_is_valid": False,
                "success": False,
                "invalid_actions": float(self.invalid_actions),
            }
            return (
                f"{feedback}\n{self.render()}",
                self.format_penalty,
                False,
                False,
                {"metrics": metrics},
            )
        index = self.action_names.index(parsed.actions[0])
        self._obs, reward, terminated, truncated, _ = self.env.step(
            int(self.env.action_space.start) + index
        )
        metrics = {
            "action_is_valid": True,
            "success": bool(terminated and float(reward) > 0),
            "invalid_actions": float(self.invalid_actions),
        }
        return (
            self.render(),
            float(reward),
            bool(terminated),
            bool(truncated),
            {"metrics": metrics},
        )

    def close(self) -> None:
        self.env.close()

    # -- text ---------------------------------------------------------------------------

    def instruction(self) -> str:
        rules = _RULES.get(
            self.kind, f"You are playing the gymnasium environment {self.env_id}."
        )
        example = self.parser.wrap(self.action_names[-1])
        return f"{rules}\nActions: {', '.join(self.action_names)}. Reply with one action inside the tags, for example {example}."

    def render(self) -> str:
        env, obs = self.env.unwrapped, self._obs
        if self.kind == "FrozenLakeEnv":
            grid = [[c.decode() for c in row] for row in env.desc]
            row, col = divmod(int(obs), env.ncol)
            grid[row][col] = "P"
            return "\n".join("".join(r) for r in grid)
        if self.kind == "TaxiEnv":
            taxi_row, taxi_col, passenger, destination = env.decode(int(obs))
            stops = "RGYB"
            where = (
                "in the taxi" if passenger == 4 else f"waiting at {stops[passenger]}"
            )
            return (
                f"{self._ansi_render()}\nThe taxi is at row {taxi_row}, column {taxi_col}. "
                f"The passenger is {where}; the destination is {stops[destination]}."
            )
        if self.kind == "BlackjackEnv":
            player, dealer, usable_ace = obs
            ace = " (with a usable ace)" if usable_ace else ""
            return f"Your hand totals {player}{ace}. The dealer shows {dealer}."
        text = self._ansi_render()
        return text if text else f"Observation: {obs}"

    def _ansi_render(self) -> str:
        if getattr(self.env, "render_mode", None) != "ansi":
            return ""
        out = self.env.render()
        return _ANSI.sub("", out).strip("\n") if isinstance(out, str) else ""


def _render_modes(spec: Any) -> list[str]:
    """The render modes an env class declares, without building it."""
    entry = spec.entry_point
    if isinstance(entry, str):
        entry = resolve_dotted(entry, f"gymnasium entry point {entry!r}")
    return list(getattr(entry, "metadata", {}).get("render_modes", []))
