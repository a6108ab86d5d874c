"""Code: a multi-turn Python task env (NeMo-RL CodeEnvironment style) with a sandbox.

Coding agents run code, read what it printed and try again before they submit;
this env gives that loop on small function-writing tasks, with every run and
the grading inside :func:`roll_async.envs.sandbox.run_python` so a submission
cannot touch the host or see the tests.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.envs.parsing import ParsedAction
from roll_async.envs.sandbox import SandboxLimits, SandboxResult, run_python
from roll_async.envs.tool_actions import decode_tool_calls, function_tool

DEFAULT_TASKS = Path(__file__).parent / "data" / "code_tasks.json"
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

# The grader runs the submission and the tests with their output discarded, then prints one line
# tagged with a per-run nonce, so nothing the submission prints can fake or hide the result.
_GRADER = """
import io, json, sys
_out = sys.stdout
sys.stdout = sys.stderr = io.StringIO()
_ns = {"__name__": "solution"}
_passed = 0
try:
    exec(compile(%(source)r, "solution.py", "exec"), _ns)
    for _test in %(tests)r:
        try:
            exec(_test, _ns)
            _passed += 1
        except BaseException:
            pass
except BaseException:
    pass
_out.write("\\n%(nonce)s " + json.dumps(_passed) + "\\n")
_out.flush()
"""


@dataclass
class CodeEnvConfig(EnvConfig):
    max_steps: int = 4
    #: JSON task file; None means the shipped tasks.
    tasks_path: str | None = None
    #: Only these task ids (empty: all).
    task_ids: list[str] = field(default_factory=list)
    #: Sandbox limits of every run and of grading.
    cpu_s: float = 2.0
    wall_s: float = 5.0
    memory_mb: int = 256
    max_output_bytes: int = 16 * 1024
    max_processes: int = 32
    #: The program's private writable space in MiB (roll_async.envs.sandbox: a tmpfs where it can mount one).
    disk_mb: int = 16
    #: Characters of stdout/stderr shown to the model per run.
    max_observation_chars: int = 1200
    success_reward: float = 1.0
    partial_credit: bool = False
    run_reward: float = 0.0
    #: tags: fenced blocks to run, ``<answer>`` to submit; tools: the ``run_python`` and ``submit`` function tools.
    action_format: str = "tags"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.action_format not in ("tags", "tools"):
            raise ValueError(
                f"code env: action_format must be tags or tools, got {self.action_format!r}"
            )
        if self.tasks_path is not None and not Path(self.tasks_path).is_file():
            raise ValueError(f"tasks_path {self.tasks_path!r} is not a file")
        for name in (
            "cpu_s",
            "wall_s",
            "memory_mb",
            "max_output_bytes",
            "max_processes",
            "disk_mb",
            "max_observation_chars",
        ):
            if float(getattr(self, name)) <= 0:
                raise ValueError(f"code env: {name}={getattr(self, name)} must be > 0")
        self.task_ids = list(self.task_ids)

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            cpu_s=float(self.cpu_s),
            wall_s=float(self.wall_s),
            memory_mb=int(self.memory_mb),
            max_output_bytes=int(self.max_output_bytes),
            max_processes=int(self.max_processes),
            disk_mb=int(self.disk_mb),
        )


def load_tasks(
    path: str | Path | None = None, task_ids: list[str] | None = None
) -> list[dict[str, Any]]:
    """The task list of ``path`` (default: the shipped file), optionally only ``task_ids``."""
    tasks = json.loads(Path(path or DEFAULT_TASKS).read_text(encoding="utf-8"))["tasks"]
    if task_ids:
        by_id = {t["id"]: t for t in tasks}
        missing = [i for i in task_ids if i not in by_id]
        if missing:
            raise ValueError(
                f"code env: task_ids {missing} are not in {path or DEFAULT_TASKS}"
            )
        tasks = [by_id[i] for i in task_ids]
    return tasks


def grade(
    source: str, tests: list[str], limits: SandboxLimits
) -> tuple[int, SandboxResult]:
    """(tests passed, the sandbox result) for ``source`` against ``tests``, run in the sandbox."""
    nonce = secrets.token_hex(8)
    result = run_python(
        _GRADER % {"source": source, "tests": list(tests), "nonce": nonce}, limits
    )
    passed = 0
    for line in result.stdout.splitlines():
        if line.startswith(nonce + " "):
            passed = int(line.split()[1])
    return passed, result


def extract_code(text: str) -> str:
    """The code of a submission: the first fenced block inside it, or the text itself."""
    fenced = _FENCE.search(text)
    return (fenced.group(1) if fenced else text).strip("\n")


class CodeEnv(BaseEnv):
    """Write, run and submit Python for a small task; graded by hidden tests in a sandbox.

    Each episode is one task of the task file (``data/code_tasks.json``: 66 small
    function-writing tasks, each with a reference solution and hidden assert
    tests; ``tasks_path`` points to another file of the same shape)::

        {"tasks": [{"id", "function", "prompt", "solution", "tests": ["assert ...", ...]}]}

    Each turn the model either runs code, writing it in a fenced block
    (```` ```python ... ``` ````), and sees what it printed (stdout, stderr, exit
    status; cut to ``max_observation_chars``), or submits its final solution inside
    ``<answer>...</answer>`` (a fenced block inside the tags is fine), which ends
    the episode: the task's tests run against it and grade it. Whichever comes
    first in a response counts. Code runs in :func:`roll_async.envs.sandbox.run_python`
    (CPU time, memory, process, output limits; no network), so a submission
    cannot touch the host or see the tests.
    """

    config_cls: ClassVar[type] = CodeEnvConfig
    multi_action: ClassVar[bool] = False

    def __init__(
        self, config: CodeEnvConfig | dict | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: CodeEnvConfig
        self.tasks = load_tasks(self.config.tasks_path, self.config.task_ids)
        self.task: dict[str, Any] = {}
        self.last_output = ""
        self.num_runs = 0
        self.limit_hits = 0
        self.tests_passed = 0.0

    def _reset(self, seed: int) -> None:
        self.task = self.tasks[
            int(np.random.default_rng(seed).integers(len(self.tasks)))
        ]
        self.last_output = ""
        self.num_runs = 0
        self.limit_hits = 0
        self.tests_passed = 0.0

    def tools(self) -> list[dict[str, Any]] | None:
        if self.config.action_format != "tools":
            return None
        code = {"code": {"type": "string", "description": "Python source"}}
        return [
            function_tool(
                "run_python",
                "Run Python code in a sandbox and see what it printed.",
                code,
                ["code"],
            ),
            function_tool(
                "submit",
                "Submit the complete solution (the function definition); hidden tests grade it and the episode ends.",
                code,
                ["code"],
            ),
        ]

    def _parse(self, action_text: str) -> ParsedAction:
        if self.config.action_format == "tools":
            calls = decode_tool_calls(action_text)
            if not calls:
                return ParsedAction(
                    error="no tool call; call run_python(code) or submit(code)"
                )
            name, arguments = calls[0]
            code = str(arguments.get("code", ""))
            kind = {"run_python": "run", "submit": "answer"}.get(name)
            if kind is None or not code.strip():
                return ParsedAction(
                    raw=name,
                    error=f"call run_python(code) or submit(code) with code, not {name}({arguments})",
                )
            return ParsedAction(actions=[f"{kind}:{code}"], raw=code, is_valid=True)
        text = action_text or ""
        run = _FENCE.search(text)
        answer = self.parser.regex.search(text)
        if run and (not answer or run.start() < answer.start()):
            return ParsedAction(
                actions=[f"run:{run.group(1)}"], raw=run.group(1), is_valid=True
            )
        if answer:
            code = extract_code(answer.group(1))
            if code.strip():
                return ParsedAction(actions=[f"answer:{code}"], raw=code, is_valid=True)
            return ParsedAction(raw=answer.group(1), error="empty answer")
        return ParsedAction(
            error="no code found; run code in a ```python block, or submit your solution inside <answer></answer>"
        )

    def _apply(self, action: str) -> tuple[float, bool, str]:
        kind, _, code = action.partition(":")
        cfg = self.config
        if kind == "run":
            self.num_runs += 1
            result = run_python(code, cfg.limits)
            self.limit_hits += result.status in (
                "timeout",
                "cpu_limit",
                "memory_limit",
                "output_limit",
            )
            self.last_output = result.report(cfg.max_observation_chars)
            return cfg.run_reward, True, ""
        tests = self.task["tests"]
        passed, result = grade(code, tests, cfg.limits)
        self.tests_passed = passed / len(tests)
        self.success = passed == len(tests)
        self.done = True
        status = (
            ""
            if result.status == "ok"
            else f" (the grading run ended: {result.status})"
        )
        self.last_output = f"{passed}/{len(tests)} tests passed{status}."
        reward = cfg.success_reward * (
            self.tests_passed if cfg.partial_credit else float(self.success)
        )
        return reward, True, ""

    def extra_metrics(self) -> dict[str, float | bool]:
        return {
            "tests_passed": self.tests_passed,
            "num_runs": float(self.num_runs),
            "sandbox_limit_hits": float(self.limit_hits),
        }

    def render_text(self) -> str:
        return (
            self.last_output
            or f"Task: {self.task['prompt']}\nExample: {self.task['tests'][0]}"
        )

    def instruction(self) -> str:
        cfg = self.config
        if cfg.action_format == "tools":
            return (
                "Solve a small Python programming task. Call run_python(code) to run code in a sandbox "
                f"(no network, {cfg.cpu_s:g}s CPU, {cfg.memory_mb} MB) and see its output; call submit(code) "
                "with the complete solution (the function definition) to have hidden tests grade it, which "
                f"ends the episode. You have {cfg.max_steps} turns."
            )
        return (
            "Solve a small Python programming task. To run code and see its output, write it in a fenced block:\n"
            "```python\nprint(1 + 1)\n```\n"
            f"Code runs in a sandbox (no network, {cfg.cpu_s:g}s CPU, {cfg.memory_mb} MB). When you are done, submit the "
            "complete solution (the function definition) inside <answer></answer>; hidden tests then grade it and the "
            f"episode ends. You have {cfg.max_steps} turns."
        )

    def expert_responses(self) -> list[str] | None:
        """Tagged responses; None in tools mode (a call's text depends on the model's format)."""
        return (
            None if self.config.action_format == "tools" else super().expert_responses()
        )

    def solve(self) -> list[str] | None:
        """The task's reference solution (one submission)."""
        return [self.task["solution"]]
