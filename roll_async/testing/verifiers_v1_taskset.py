"""A small verifiers 0.4 (``verifiers.v1``) taskset for tests: ``env_type: verifiers:roll_async.testing.verifiers_v1_taskset``.

``QATaskset`` yields ``num_rows`` tasks (task i asks ``What is i + i?``); ``QATask`` scores ``correct``
(weight 1: the last reply holds the answer) and ``replied`` (weight 0.5), and records the metric
``num_calls``. ``ChatHarness`` is an in-process chat loop (no program, no sandbox): it calls the model at the
rollout's interception endpoint ``turns`` times (the env_config's ``turns`` rides on the task), adding a
user turn between calls; ``raise_on_turn`` makes it raise mid-episode instead. Only verifiers >= 0.4 can
load it (it imports ``verifiers.v1`` at import time, as a taskset module does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import openai
import verifiers.v1 as vf

__all__ = ["QATaskset", "ChatHarness"]


class QAData(vf.TaskData):  # type: ignore[misc]
    answer: str = ""
    turns: int = 1
    raise_on_turn: bool = False


class QATask(vf.Task[QAData]):  # type: ignore[misc]
    @vf.reward(weight=1.0)  # type: ignore[untyped-decorator]  # verifiers is not typed
    async def correct(self, trace: Any) -> float:
        replies = [m for m in trace.branches[-1].messages if m.role == "assistant"]
        text = str(replies[-1].content or "") if replies else ""
        return 1.0 if self.data.answer in text.split() else 0.0

    @vf.reward(weight=0.5)  # type: ignore[untyped-decorator]
    async def replied(self, trace: Any) -> float:
        replies = [m for m in trace.branches[-1].messages if m.role == "assistant"]
        return 1.0 if replies and str(replies[-1].content or "").strip() else 0.0

    @vf.metric  # type: ignore[untyped-decorator]
    async def num_calls(self, trace: Any) -> float:
        return float(len(trace.calls))


class QATasksetConfig(vf.TasksetConfig):  # type: ignore[misc]
    num_rows: int = 3
    turns: int = 1
    raise_on_turn: bool = False


class QATaskset(vf.Taskset[QATask, QATasksetConfig]):  # type: ignore[misc]
    def load(self) -> Iterable[QATask]:
        for i in range(self.config.num_rows):
            yield QATask(
                QAData(
                    prompt=f"What is {i} + {i}?",
                    system_prompt="Answer with one number.",
                    answer=str(2 * i),
                    turns=self.config.turns,
                    raise_on_turn=self.config.raise_on_turn,
                ),
                self.config.task,
            )


class ChatHarnessConfig(vf.HarnessConfig):  # type: ignore[misc]
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):  # type: ignore[misc]
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
    ) -> Any:
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        messages: list[dict[str, str]] = []
        if data.system_prompt:
            messages.append({"role": "system", "content": data.system_prompt})
        messages.append({"role": "user", "content": str(data.prompt)})
        try:
            for turn in range(data.turns):
                if turn and data.raise_on_turn:
                    raise RuntimeError("the harness turn failed")
                if turn:
                    messages.append(
                        {"role": "user", "content": "Are you sure? Answer again."}
                    )
                reply = await client.chat.completions.create(
                    model=ctx.model, messages=messages
                )
                messages.append(
                    {
                        "role": "assistant",
                        "content": reply.choices[0].message.content or "",
                    }
                )
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
