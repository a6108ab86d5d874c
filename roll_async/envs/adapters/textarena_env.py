"""``textarena:<EnvId>``: a TextArena single-player game behind the project's text env contract.

TextArena's games are ready-made text tasks; the adapter plays the game object
itself, below TextArena's default wrappers (which re-send the whole history each
turn, while here the chat history already holds it, token-exact).
"""

from __future__ import annotations

from typing import Any

from roll_async.envs.adapters import import_optional, unknown_name_error
from roll_async.errors import ConfigError, LifecycleError

#: Game families that reach the network on make/reset, and why.
NETWORKED_GAMES: dict[str, str] = {
    "Wordle": "downloads NLTK word lists",
    "Hangman": "downloads NLTK word lists",
    "WordLadder": "downloads NLTK word lists",
    "WordSearch": "downloads NLTK word lists",
    "TwentyQuestions": "calls an LLM game master through OpenRouter",
    "GuessWho": "calls an LLM game master through OpenRouter",
    "Codenames": "downloads NLTK word lists",
    "DontSayIt": "downloads NLTK word lists",
    "LetterAuction": "downloads NLTK word lists",
    "SpellingBee": "downloads NLTK word lists",
    "WordChains": "downloads NLTK word lists",
    "Debate": "calls an LLM jury through OpenRouter",
    "ScenarioPlanning": "calls an LLM jury through OpenRouter",
}


def load_textarena_game(
    env_id: str, allow_network: bool, make_kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    """``(textarena, game)``: the game object below TextArena's wrappers, refused when it reaches the network.

    Shared by the single-player env and the multi-player game adapter, so both refuse the
    same ids with the same lines.
    """
    env_type = f"textarena:{env_id}"
    ta = import_optional("textarena", "textarena", env_type)
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        raise unknown_name_error("TextArena", env_type, env_id, ENV_REGISTRY)
    family = env_id.split("-v")[0]
    if family in NETWORKED_GAMES and not allow_network:
        raise ConfigError(
            f"env_type {env_type!r} {NETWORKED_GAMES[family]}, so it does not run offline; "
            "set env_config.allow_network: true if this machine may reach the network"
        )
    try:
        game = ta.make(env_id, **make_kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"env_type {env_type!r}: textarena.make rejected env_config {make_kwargs}: {exc}"
        ) from None
    # below the wrappers: the raw observation tuples
    while isinstance(game, ta.Wrapper):
        game = game.env
    return ta, game


class TextArenaEnv:
    """A single-player TextArena game.

    ``textarena.make(env_id, **env_config)`` builds the game; the adapter plays the
    game object itself, below TextArena's default wrappers (which re-send the whole
    history each turn: here the chat history already holds it, token-exact).

    * Observations: TextArena hands the player a list of ``(from_id, message,
      observation_type)`` tuples. The game's prompt (``PROMPT``) is the first
      turn's instruction; every other message from the game is rendered as a text
      line; the echo of the player's own action is dropped (it is already in the
      conversation as the model's reply).
    * Actions: the model's whole reply goes to ``env.step`` (TextArena games parse
      their own ``[move]`` syntax).
    * Rewards: TextArena settles rewards at the end: when the game is done the
      adapter calls ``close()`` and returns ``rewards[0]`` as that step's reward
      (0 on every earlier step).
    * Invalid moves: every call of the game's ``state.set_invalid_move`` is counted
      (``invalid_move`` this turn, ``invalid_moves`` so far in ``info["metrics"]``);
      TextArena itself ends the game after its error allowance.

    Multi-player games are refused here with a clear error (they are played through
    the seat contract: :class:`~roll_async.envs.adapters.textarena_game.TextArenaGame`).
    Some games reach the network (Wordle, Hangman, WordLadder and WordSearch download
    NLTK word lists on first use; TwentyQuestions and GuessWho call an LLM through
    OpenRouter; ``NETWORKED_GAMES`` lists them, multi-player ones included): they are
    refused unless ``allow_network: true`` is given.
    Offline, checked: GuessTheNumber, Minesweeper, TowerOfHanoi, FrozenLake,
    Sudoku, Mastermind, LightsOut, Countdown, FifteenPuzzle, Sokoban, Crosswords,
    Bandit, Blackjack, RushHour, PegJump, Set, Secretary, 2048, Cryptarithm,
    LogicPuzzle, ThreeCardMonte, Slitherlink.
    """

    def __init__(
        self, env_id: str, *, allow_network: bool = False, **make_kwargs: Any
    ) -> None:
        ta, self.game = load_textarena_game(env_id, allow_network, make_kwargs)
        self.env_id = env_id
        self._prompt_type = ta.ObservationType.PROMPT
        self._action_type = ta.ObservationType.PLAYER_ACTION
        self.invalid_moves = 0
        self._invalid_this_turn = False
        self._done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        try:
            self.game.reset(num_players=1, seed=int(seed))
        except AssertionError as exc:
            raise ConfigError(
                f"env_type 'textarena:{self.env_id}' is not a single-player game ({exc}); the textarena adapter "
                "plays single-player games such as GuessTheNumber-v0, Minesweeper-v0, TowerOfHanoi-v0; "
                "multi-player games are played through roll_async.envs.multiplayer.make_game"
            ) from None
        self._count_invalid_moves()
        self.invalid_moves = 0
        self._done = False
        instruction, observation = self._read_observation()
        return observation, {"instruction": instruction, "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise LifecycleError(
                f"textarena:{self.env_id}: step() after the game ended; call reset()"
            )
        self._invalid_this_turn = False
        done, _ = self.game.step(action_text)
        prompt, observation = self._read_observation()
        text = "\n".join(t for t in (prompt, observation) if t)
        reward = 0.0
        game_info: dict[int, Any] = {}
        if done:
            self._done = True
            rewards, game_info = self.game.close()
            reward = float((rewards or {}).get(0, 0.0))
            reason = (game_info or {}).get(0, {}).get("reason")
            if reason:
                text = f"{text}\n{reason}".strip()
        metrics = {
            "invalid_move": self._invalid_this_turn,
            "invalid_moves": float(self.invalid_moves),
            "success": bool(done and reward > 0),
        }
        return (
            text,
            reward,
            bool(done),
            False,
            {"metrics": metrics, "game_info": game_info},
        )

    def close(self) -> None:
        """Nothing held open; TextArena's own ``close()`` settles rewards and is called when the game ends."""

    # -- internals ----------------------------------------------------------------------

    def _count_invalid_moves(self) -> None:
        """Wrap this game's ``state.set_invalid_move`` (a fresh state per reset) so every invalid move is counted."""
        state = self.game.state
        original = state.set_invalid_move

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.invalid_moves += 1
            self._invalid_this_turn = True
            return original(*args, **kwargs)

        state.set_invalid_move = counted

    def _read_observation(self) -> tuple[str, str]:
        """(the game's prompt text, the other game messages as lines) since the last read."""
        _, messages = self.game.get_observation()
        prompt: list[str] = []
        lines: list[str] = []
        for sender, message, kind in messages or []:
            if kind == self._action_type and sender == 0:
                continue
            (prompt if kind == self._prompt_type else lines).append(
                str(message).strip()
            )
        return "\n".join(prompt), "\n".join(lines)
