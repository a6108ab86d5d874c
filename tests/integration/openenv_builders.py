"""An ``action_builder`` for the OpenEnv config's training test: every reply guesses 1, so with ``high: 1``
each episode is won in one turn and its reward is the server's 1.0, whatever the random-init model writes."""

from __future__ import annotations


def guess_one(reply: str) -> dict[str, int]:
    return {"guess": 1}
