"""The text a reward model reads: question, response, reference, conversation, of a finished episode or of one turn.

A Trajectory stores token ids and per-turn action/observation text but not the
instruction the env rendered, so the caller (the EnvManager, which has it) may
pass the question and reference; otherwise the question is decoded from the
first-turn prompt ids, and the judge still sees the response it must score. A
turn's view (``per_turn``) asks about the user text that turn answered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from roll_async.trajectory import Trajectory, TurnRecord


@dataclass(frozen=True)
class EpisodeText:
    """The fields a reward prompt_template may use (roll_async.config.reward_rules.TEMPLATE_FIELDS)."""

    question: str
    response: str
    reference: str = ""
    conversation: str = ""

    def fields(self) -> dict[str, str]:
        return {
            "question": self.question,
            "response": self.response,
            "reference": self.reference,
            "conversation": self.conversation,
        }


def episode_text(
    trajectory: Trajectory,
    *,
    question: str | None = None,
    reference: str | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> EpisodeText:
    """Outcome view of ``trajectory``: the last turn's action is the response.

    ``question``: the first user message as the env rendered it; when None it is ``decode`` of the
    first-turn prompt ids (chat-template text included), or "" without ``decode``. The conversation
    alternates the model's actions and the env's observations, leaving out the final observation
    (it may reveal the env's verdict).
    """
    if question is None:
        question = (
            decode(trajectory.token_ids[: trajectory.prompt_length])
            if decode is not None and trajectory.prompt_length > 0
            else ""
        )
    turns = trajectory.turns
    return EpisodeText(
        question=question,
        response=turns[-1].action_text if turns else "",
        reference=reference or "",
        conversation=_conversation(question, turns),
    )


def turn_text(
    trajectory: Trajectory,
    turn: int,
    *,
    question: str,
    first_question: str,
    reference: str | None = None,
) -> EpisodeText:
    """Per-turn view: turn ``turn``'s action is the response, ``question`` the user text it answered.

    The conversation runs from ``first_question`` up to this turn's reply (its own observation left out).
    """
    turns = trajectory.turns[: turn + 1]
    return EpisodeText(
        question=question,
        response=turns[-1].action_text if turns else "",
        reference=reference or "",
        conversation=_conversation(first_question, turns),
    )


def _conversation(first_question: str, turns: list[TurnRecord]) -> str:
    """The model's actions alternating with the env's observations, without the last observation."""
    parts = [f"User: {first_question}"] if first_question else []
    for index, turn in enumerate(turns):
        parts.append(f"Assistant: {turn.action_text}")
        if index < len(turns) - 1 and turn.observation:
            parts.append(f"User: {turn.observation}")
    return "\n\n".join(parts)
