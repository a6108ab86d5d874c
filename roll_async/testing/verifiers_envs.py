"""Small classic (verifiers < 0.4) environments for tests: ``env_type: verifiers:roll_async.testing.verifiers_envs``.

``vf.load_environment`` imports this module and calls :func:`load_environment` with the tag's
``env_config``; ``kind`` picks the env: ``single`` (a SingleTurnEnv), ``multi`` (two turns, the env
answers the first reply), ``raising`` (its env turn raises mid-episode) or ``broken`` (raises while
loading). Each row asks ``What is i + i?``; the rubric scores ``correct`` (weight 1: the reply holds
the answer) and ``replied`` (weight 0.5: the reply is not empty), so a reply that is right scores 1.5.
Importable by Ray workers (a test aid of the package), and verifiers is imported only when loaded.
"""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = "Answer with one number."


def load_environment(kind: str = "single", num_rows: int = 3) -> Any:
    """The ``kind`` test env over ``num_rows`` rows (row i: ``What is i + i?``, answer ``2i``)."""
    import verifiers as vf  # optional dependency, imported when a test loads this env
    from datasets import Dataset

    if kind == "broken":
        raise RuntimeError("this test environment cannot load")
    rows = [
        {"question": f"What is {i} + {i}?", "answer": str(2 * i)}
        for i in range(num_rows)
    ]

    def reply_text(completion: Any) -> str:
        if isinstance(completion, str):
            return completion
        return " ".join(
            str(m.get("content") or "")
            for m in completion
            if m.get("role") == "assistant"
        )

    def correct(completion: Any, answer: str, **_: Any) -> float:
        return 1.0 if answer in reply_text(completion).split() else 0.0

    def replied(completion: Any, **_: Any) -> float:
        return 1.0 if reply_text(completion).strip() else 0.0

    rubric = vf.Rubric(funcs=[correct, replied], weights=[1.0, 0.5])
    dataset = Dataset.from_list(rows)
    if kind == "single":
        return vf.SingleTurnEnv(
            dataset=dataset, rubric=rubric, system_prompt=SYSTEM_PROMPT
        )
    if kind not in ("multi", "raising"):
        raise ValueError(f"kind={kind!r}: use single, multi, raising or broken")

    class TwoTurnEnv(vf.MultiTurnEnv):  # type: ignore[misc]
        async def env_response(
            self, messages: Any, state: Any, **kwargs: Any
        ) -> list[dict[str, str]]:
            if kind == "raising":
                raise RuntimeError("the env turn failed")
            return [{"role": "user", "content": "Are you sure? Answer again."}]

    return TwoTurnEnv(
        dataset=dataset, rubric=rubric, system_prompt=SYSTEM_PROMPT, max_turns=2
    )
