"""The swe rollout benchmark's scripted agent and its instrumented env: real workspaces, no model.

A benchmark of how rollouts are scheduled around real shells needs episodes whose length and command
costs look like an agent's, reproducibly, without a model deciding. :func:`plan_episode` turns a
shipped task's reference solution into one: a seeded, heavy-tailed number of exploratory commands
(``ls``, ``cat``, ``grep``, ``find``, running pytest or the script) before the fix, sometimes a check
after it, then ``submit``; each reply opens with a seeded amount of "thinking" prose, so the policy's
time per turn varies as a model's would. :class:`ScriptedReplies` is the ``replies`` hook of
``sim_engine.SimEngine``: it reads the episode's seed from the prompt (the env writes it into the
first user turn) and the episode and turn from the request id, and returns the reply's token ids.
:class:`BenchSweEnv` is the real ``SweEnv`` with a runtime shared by every env of a run (one warm pool)
and a :class:`WorkspaceLedger` that records when each workspace started, ran commands, was verified
and closed, so the benchmark can say where the time went and how busy the containers were.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from roll_async.envs.swe.actions import Command
from roll_async.envs.swe.env import SweConfig, SweEnv
from roll_async.envs.swe.task_spec import TaskSpec
from roll_async.trajectory import GenerationRequest
from roll_async.workspaces.interface import WorkspaceRuntime

#: Written into the first user turn by :class:`BenchSweEnv`; the scripted policy reads the seed back from it.
SEED_MARKER = "[bench episode seed {seed}]"
_SEED_RE = re.compile(r"\[bench episode seed (\d+)\]")
_REQUEST_RE = re.compile(r"-e(\d+)-env\d+-t(\d+)-r\d+$")
_WORDS = (
    "the failing test probably exercises this function so I should read it first and check "
    "what the expected output is before changing anything else in the module then rerun it"
).split()

SpanKind = Literal["start", "policy", "exec", "verifier", "close", "open"]


@dataclass(frozen=True)
class PlanConfig:
    """How episodes are drawn: ``detour_alpha`` is the Pareto tail of the exploratory commands before
    the fix (smaller: longer tail), at most ``max_detours``; ``check_prob`` the chance of running the
    tests again after the fix; thinking prose is lognormal with median ``think_words_median`` words."""

    detour_alpha: float = 1.2
    max_detours: int = 12
    check_prob: float = 0.5
    think_words_median: float = 40.0
    think_words_sigma: float = 0.8
    max_think_words: int = 400


@dataclass(frozen=True)
class EpisodePlan:
    """One scripted episode: the replies in order (the last one submits)."""

    task_id: str
    replies: tuple[str, ...]
    detours: int


def _task_files(task: TaskSpec) -> list[str]:
    root = task.files
    if root is None or not Path(root).is_dir():
        return []
    return sorted(
        str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file()
    )


def _detour(rng: random.Random, files: list[str]) -> str:
    """One exploratory command, as an agent would type it while finding its way around."""
    name = rng.choice(files) if files else "."
    word = rng.choice(("def", "return", "if", "echo", "=", "import", "TODO"))
    py = [f for f in files if f.endswith(".py")]
    sh = [f for f in files if f.endswith(".sh")]
    choices = [
        "ls -la",
        "find . -type f | head -50",
        f"cat {name}",
        f"grep -rn '{word}' . | head -40",
        f"wc -l {name}",
        "python3 -m pytest -q -x 2>&1 | tail -15",
    ]
    if py:
        module = rng.choice(py)[:-3].replace("/", ".")
        choices.append(f"python3 -c 'import {module}; print(dir({module}))'")
    if sh:
        choices.append(f"bash {rng.choice(sh)} < /dev/null 2>&1 | head -20")
    return rng.choice(choices)


def _thought(rng: random.Random, config: PlanConfig) -> str:
    words = int(
        rng.lognormvariate(0.0, config.think_words_sigma) * config.think_words_median
    )
    words = max(1, min(config.max_think_words, words))
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _reply(rng: random.Random, config: PlanConfig, command: str) -> str:
    return f"THOUGHT: {_thought(rng, config)}\n\n```bash\n{command.rstrip()}\n```"


def plan_episode(
    task: TaskSpec, seed: int, episode_id: int, config: PlanConfig, max_turns: int
) -> EpisodePlan:
    """The scripted episode for (seed, episode_id): the same on every scheduler; at most ``max_turns`` replies."""
    if not task.solution or "```" in task.solution:
        raise ValueError(
            f"task {task.task_id} has no reference solution the text format can carry"
        )
    rng = random.Random(f"{seed}:{episode_id}")
    files = _task_files(task)
    room = max(0, max_turns - 2)  # the fix and the submit always fit
    before = min(
        config.max_detours, int(rng.paretovariate(config.detour_alpha)) - 1, room
    )
    after = 1 if rng.random() < config.check_prob and before < room else 0
    commands = [_detour(rng, files) for _ in range(before)]
    commands.append(task.solution)
    commands += [_detour(rng, files) for _ in range(after)]
    replies = [_reply(rng, config, c) for c in commands]
    replies.append(_reply(rng, config, "submit"))
    return EpisodePlan(task.task_id, tuple(replies), before + after)


class ScriptedReplies:
    """``SimEngine(replies=...)``: the token ids of each episode's next scripted reply."""

    def __init__(
        self,
        tasks: list[TaskSpec],
        tokenizer: Any,
        config: PlanConfig,
        max_turns: int,
    ) -> None:
        self.tasks = tasks
        self.tokenizer = tokenizer
        self.config = config
        self.max_turns = max_turns
        self._plans: dict[str, EpisodePlan] = {}

    def plan_for(self, seed: int, episode_id: int) -> EpisodePlan:
        task = self.tasks[seed % len(self.tasks)]
        return plan_episode(task, seed, episode_id, self.config, self.max_turns)

    def __call__(self, request: GenerationRequest) -> list[int]:
        found = _REQUEST_RE.search(request.request_id)
        if found is None:
            raise ValueError(
                f"request id {request.request_id!r} does not end in -e<episode>-env<env>-t<turn>-r<n>"
            )
        episode_id, turn = int(found.group(1)), int(found.group(2))
        key = request.request_id[: found.start(2)]
        plan = self._plans.get(key)
        if plan is None:
            head = self.tokenizer.decode(request.prompt_token_ids[:2048])
            marker = _SEED_RE.search(head)
            if marker is None:
                raise ValueError(
                    f"request {request.request_id}: no '{SEED_MARKER}' in the prompt; the env must be BenchSweEnv"
                )
            plan = self._plans[key] = self.plan_for(int(marker.group(1)), episode_id)
        text = plan.replies[min(turn, len(plan.replies) - 1)]
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids


@dataclass
class WorkspaceLedger:
    """Every workspace span of one run, on ``time.monotonic()``: what each workspace did and when.

    ``spans`` are (kind, start, end): ``start`` a workspace start (container taken from the pool or
    created, files copied in), ``policy`` one engine request (the benchmark's engine wrapper adds
    those), ``exec`` one agent command, ``verifier`` the hidden tests, ``close``
    the removal, ``open`` a workspace's whole life from the start's end to the close's start.
    """

    spans: list[tuple[SpanKind, float, float]] = field(default_factory=list)
    pool_hits: int = 0
    starts: int = 0

    def add(self, kind: SpanKind, start: float, end: float) -> None:
        self.spans.append((kind, start, end))

    def seconds(self, kind: SpanKind, window: tuple[float, float]) -> float:
        """Seconds of ``kind`` spans inside ``window`` (spans cut at its edges)."""
        lo, hi = window
        return sum(
            max(0.0, min(e, hi) - max(s, lo)) for k, s, e in self.spans if k == kind
        )

    def count(self, kind: SpanKind, window: tuple[float, float]) -> int:
        lo, hi = window
        return sum(1 for k, s, e in self.spans if k == kind and lo <= e and s <= hi)


class BenchSweEnv(SweEnv):
    """``SweEnv`` on a runtime shared by the run's envs, with every workspace span in ``ledger``.

    The shared runtime is the benchmark's (``workspace_runtime``): the env closes its workspaces, never the runtime.
    The episode's seed goes into the instruction (``SEED_MARKER``) for the scripted policy.
    """

    def __init__(
        self,
        config: SweConfig | dict[str, Any],
        *,
        runtime: WorkspaceRuntime,
        ledger: WorkspaceLedger,
    ) -> None:
        super().__init__(config, workspace_runtime=runtime)
        self.ledger = ledger
        self._opened_at = 0.0
        #: when the last command of the current step ended (or the step began): the verifier starts there
        self._mark = 0.0

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        began = time.monotonic()
        observation, info = await super().reset(seed)
        now = time.monotonic()
        self.ledger.add("start", began, now)
        self.ledger.starts += 1
        if self.workspace is not None and self.workspace.stats.pool_hit:
            self.ledger.pool_hits += 1
        self._opened_at = now
        info["instruction"] = (
            f"{SEED_MARKER.format(seed=int(seed))}\n{info['instruction']}"
        )
        return observation, info

    async def step(
        self, action_text: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._mark = time.monotonic()
        return await super().step(action_text)

    async def _run(self, command: Command, labelled: bool) -> str:
        began = time.monotonic()
        try:
            return await super()._run(command, labelled)
        finally:
            self._mark = time.monotonic()
            self.ledger.add("exec", began, self._mark)

    async def _close_workspace(self) -> None:
        if self.workspace is None:
            return
        began = time.monotonic()
        if self.verdict is not None and self._mark:
            # step() verifies after its last command and closes right after: that stretch is the verifier's
            self.ledger.add("verifier", self._mark, began)
        self._mark = 0.0
        self.ledger.add("open", self._opened_at, began)
        await super()._close_workspace()
        self.ledger.add("close", began, time.monotonic())
