"""The text of a finished episode that a reward model reads: question, last response, reference, conversation.

A Trajectory stores token ids and per-turn action/observation text but not the
instruction the env rendered, so the caller (the EnvManager, which has it) may
pass the question and reference; otherwise the question is decoded from the
first-turn prompt ids, and the judge still sees the response it must score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from roll_async.trajectory import Trajectory


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
    response = turns[-1].action_text if turns else ""
    parts = [f"User: {question}"] if question else []
    for index, turn in enumerate(turns):
        parts.append(f"Assistant: {turn.action_text}")
        if index < len(turns) - 1 and turn.observation:
            parts.append(f"User: {turn.observation}")
    return EpisodeText(
        question=question,
        response=response,
        reference=reference or "",
        conversation="\n\n".join(parts),
    )
