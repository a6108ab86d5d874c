"""Code: a multi-turn Python task env (NeMo-RL CodeEnvironment style) with a sandbox.

Coding agents run code, read what it printed and try again before they submit;
this env gives that loop on small function-writing tasks, with every run and
the submission's part of grading inside :func:`roll_async.workspaces.sandbox.run_python`
so a submission cannot touch the host, see the tests or produce its own verdict:
the sandbox only returns what the tests' calls returned, and the verdict is
computed here (:func:`grade`).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import re
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig
from roll_async.envs.parsing import ParsedAction
from roll_async.envs.tool_actions import decode_tool_calls, function_tool
from roll_async.errors import ConfigError, DatasetError, ParseError, RollAsyncError
from roll_async.workspaces.sandbox import (
    SandboxLimits,
    SandboxResult,
    process_isolation,
    run_python,
)

DEFAULT_TASKS = Path(__file__).parent / "data" / "code_tasks.json"
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

#: Largest encoded result of one grading run (the sandbox's answer) the parent accepts.
MAX_RESULT_BYTES = 256 * 1024
#: Deepest nesting of a returned value the parent accepts.
MAX_RESULT_DEPTH = 64
#: Names a test evaluates in the parent: builtins, unless the task's function shadows one.
_BUILTINS = frozenset(dir(builtins))
#: Held while a test is split. Graders run in threads, and CPython 3.11.7's ``ast`` keeps one recursion
#: counter per interpreter: another thread's parse during a thread switch inside this one's (a finalizer
#: run by the collector) makes this one raise ``SystemError: AST constructor recursion depth mismatch``.
_AST_LOCK = threading.Lock()

# Runs in the sandbox: the submission, then each call of the tests (their inputs, nothing else),
# printing one line of plain data: ["ok", tagged value] or ["raised", exception name] per call.
# It writes on fd 1 after the submission's own output was sent to /dev/null; whatever the program
# writes instead can only claim other return values, which the parent then checks like any others.
_GRADER = """
import json as _json, os as _os, sys as _sys
_CALLS = %(calls)r
_LIMIT = %(limit)d
_PLAIN = (int, float, bool, str, bytes, type(None), list, tuple, dict, set, frozenset)
def _enc(value, depth):
    kind = type(value)
    if depth > %(depth)d or kind not in _PLAIN:
        raise TypeError("not plain data: " + kind.__name__)
    if kind is bool or kind is type(None):
        return ["none"] if value is None else ["bool", value]
    if kind is int:
        return ["int", hex(value)]
    if kind is float:
        return ["float", value.hex()]
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind is dict:
        return ["dict", [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in value.items()]]
    return [kind.__name__, [_enc(item, depth + 1) for item in value]]
_out = _os.dup(1)
_sys.stdout = _sys.stderr = open(_os.devnull, "w")
_ns = {"__name__": "solution"}
_results = []
try:
    exec(compile(%(source)r, "solution.py", "exec"), _ns)
    _loaded = None
except BaseException as _error:
    _loaded = ["raised", type(_error).__name__]
for _call in _CALLS:
    if _loaded:
        _results.append(_loaded)
        continue
    try:
        _value = eval(compile(_call, "test.py", "eval"), _ns)
    except BaseException as _error:
        _results.append(["raised", type(_error).__name__])
        continue
    try:
        _results.append(["ok", _enc(_value, 0)])
    except BaseException as _error:
        _results.append(["raised", "unencodable " + type(_value).__name__])
_line = _json.dumps(_results)
if len(_line) > _LIMIT:
    _line = _json.dumps([["raised", "result too large"]] * len(_CALLS))
_os.write(_out, ("\\n" + _line + "\\n").encode())
_os._exit(0)
"""


class SubmissionRaised(RollAsyncError):
    """A call of the submission raised in the sandbox (or returned something not plain data)."""


@dataclass(frozen=True)
class SplitTest:
    """One hidden test split for grading: the calls run in the sandbox, the check runs in the parent.

    ``calls`` are the source of the outermost calls of names the submission defines (the task's
    ``function`` or any name that is not a builtin); ``check`` is the test's expression with call ``i``
    replaced by ``__result__(i)`` (lazy, so ``and``/``or`` short-circuit as in the original test).
    """

    calls: tuple[str, ...]
    check: types.CodeType  # of mode "eval"


def split_test(test: str, function: str, task_id: str) -> SplitTest:
    """Split ``assert EXPR`` into the calls the sandbox evaluates and the check the parent evaluates.

    Raises ``DatasetError`` (one line naming the task) for any form that cannot be split this way: not a
    single assert, a name the submission defines used other than as a call (``map(f, xs)``), a test
    that binds names (lambda, comprehension, ``:=``), or a test that calls nothing of the submission.
    """
    with _AST_LOCK:
        return _split_test(test, function, task_id)


def _split_test(test: str, function: str, task_id: str) -> SplitTest:
    where = f"code task {task_id!r}: test {test!r}"
    try:
        module = ast.parse(test, mode="exec")
    except SyntaxError as exc:
        raise DatasetError(f"{where} is not valid Python ({exc.msg})") from None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Assert):
        raise DatasetError(f"{where} must be one 'assert EXPR' statement")
    expr = module.body[0].test
    for node in ast.walk(expr):
        if isinstance(
            node,
            ast.Lambda | ast.NamedExpr | ast.comprehension | ast.Await | ast.Yield,
        ):
            raise DatasetError(
                f"{where} binds names ({type(node).__name__}); only plain expressions can be split "
                "into sandboxed calls and a trusted check"
            )
    own = {function} | {
        n.id
        for n in ast.walk(expr)
        if isinstance(n, ast.Name) and n.id not in _BUILTINS
    }
    calls: list[str] = []

    class _Split(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            if isinstance(node.func, ast.Name) and node.func.id in own:
                calls.append(ast.unparse(node))
                return ast.copy_location(
                    ast.Call(
                        func=ast.Name("__result__", ast.Load()),
                        args=[ast.Constant(len(calls) - 1)],
                        keywords=[],
                    ),
                    node,
                )
            return self.generic_visit(node)

        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in own:
                raise DatasetError(
                    f"{where} uses {node.id!r} other than as a direct call; a test may only call the "
                    "submission's functions (their results are compared in the grader)"
                )
            return node

    check = ast.fix_missing_locations(ast.Expression(_Split().visit(expr)))
    if not calls:
        raise DatasetError(f"{where} calls none of the submission's functions")
    return SplitTest(tuple(calls), compile(check, f"<test of {task_id}>", "eval"))


def decode_result(data: Any, depth: int = 0) -> Any:
    """A value the sandbox returned, rebuilt from its tagged JSON as exact plain types.

    Only int, float (nan and inf included), bool, str, bytes, None, list, tuple, dict, set and
    frozenset come back, so a submission cannot hand the check an object whose ``__eq__`` lies;
    anything else raises ``ParseError``.
    """
    if depth > MAX_RESULT_DEPTH or type(data) is not list or not data:
        raise ParseError("malformed result")
    tag, *rest = data
    if tag == "none" and not rest:
        return None
    if len(rest) != 1:
        raise ParseError("malformed result")
    (body,) = rest
    if tag == "bool" and type(body) is bool:
        return body
    if tag == "int" and type(body) is str and _HEX_INT.fullmatch(body):
        return int(body, 16)
    if tag == "float" and type(body) is str and _HEX_FLOAT.fullmatch(body):
        return float.fromhex(body)
    if tag == "str" and type(body) is str:
        return body
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ParseError("malformed result")
    if tag == "dict":
        pairs = [
            (p[0], p[1]) if type(p) is list and len(p) == 2 else None for p in body
        ]
        if None in pairs:
            raise ParseError("malformed result")
        checked = cast("list[tuple[Any, Any]]", pairs)  # None was ruled out above
        return {
            decode_result(k, depth + 1): decode_result(v, depth + 1) for k, v in checked
        }
    kind = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}.get(tag)
    if kind is None:
        raise ParseError(f"unknown result tag {tag!r}")
    return kind(decode_result(item, depth + 1) for item in body)


_HEX_INT = re.compile(r"-?0x[0-9a-f]+")
_HEX_FLOAT = re.compile(r"-?(0x[0-9a-f]+(\.[0-9a-f]*)?p[+-]\d+|inf|nan)")


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
    #: The program's private writable space in MiB (roll_async.workspaces.sandbox: a tmpfs where it can mount one).
    disk_mb: int = 16
    #: Characters of stdout/stderr shown to the model per run.
    max_observation_chars: int = 1200
    success_reward: float = 1.0
    partial_credit: bool = False
    run_reward: float = 0.0
    #: tags: fenced blocks to run, ``<answer>`` to submit; tools: the ``run_python`` and ``submit`` function tools.
    action_format: str = "tags"
    #: namespaces: each run in its own PID, mount and network namespace (root and ``unshare``; refused at
    #: load where missing); rlimits: process group, rlimits and a temp dir only (see roll_async.workspaces.sandbox).
    sandbox_isolation: Literal["namespaces", "rlimits"] = "namespaces"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.action_format not in ("tags", "tools"):
            raise ConfigError(
                f"code env: action_format must be tags or tools, got {self.action_format!r}"
            )
        if self.tasks_path is not None and not Path(self.tasks_path).is_file():
            raise ConfigError(f"tasks_path {self.tasks_path!r} is not a file")
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
                raise ConfigError(f"code env: {name}={getattr(self, name)} must be > 0")
        self.task_ids = list(self.task_ids)
        if self.sandbox_isolation not in ("namespaces", "rlimits"):
            raise ConfigError(
                f"code env: sandbox_isolation={self.sandbox_isolation!r} must be namespaces or rlimits"
            )
        try:
            process_isolation(self.sandbox_isolation)
        except RuntimeError as exc:
            raise ConfigError(f"code env: env_config.{exc}") from None

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            cpu_s=float(self.cpu_s),
            wall_s=float(self.wall_s),
            memory_mb=int(self.memory_mb),
            max_output_bytes=int(self.max_output_bytes),
            max_processes=int(self.max_processes),
            disk_mb=int(self.disk_mb),
            sandbox_isolation=self.sandbox_isolation,
        )


def load_tasks(
    path: str | Path | None = None, task_ids: list[str] | None = None
) -> list[dict[str, Any]]:
    """The task list of ``path`` (default: the shipped file), optionally only ``task_ids``."""
    tasks: list[dict[str, Any]] = json.loads(
        Path(path or DEFAULT_TASKS).read_text(encoding="utf-8")
    )["tasks"]
    if task_ids:
        by_id = {t["id"]: t for t in tasks}
        missing = [i for i in task_ids if i not in by_id]
        if missing:
            raise DatasetError(
                f"code env: task_ids {missing} are not in {path or DEFAULT_TASKS}"
            )
        tasks = [by_id[i] for i in task_ids]
    return tasks


def split_tasks(tasks: list[dict[str, Any]]) -> dict[str, list[SplitTest]]:
    """Every task's tests split for grading (:func:`split_test`), by task id; a form that cannot be split raises."""
    return {
        task["id"]: [split_test(t, task["function"], task["id"]) for t in task["tests"]]
        for task in tasks
    }


def grade(
    source: str,
    tests: list[str] | list[SplitTest],
    limits: SandboxLimits,
    function: str = "",
) -> tuple[int, SandboxResult]:
    """(tests passed, the sandbox result) for ``source`` against ``tests``; no verdict comes from the sandbox.

    The sandbox runs the submission, then the calls of each test (see :func:`split_test`), and prints
    their results as plain data; this process decodes them (:func:`decode_result`, never ``eval`` of
    sandbox text) and evaluates each test's check with them. The expected values, the tests' source
    and the checks never enter the sandbox; the calls' inputs necessarily do (the program could read
    them by introspection, but not what they should return). A program that exits early, crashes the
    run or prints a line of its own gets no result or only results of its own making, which pass only
    if they are right. ``tests`` are ``assert`` lines (split here; ``function`` names the task's
    function) or tests already split at load.
    """
    split = [
        t if isinstance(t, SplitTest) else split_test(t, function, "(grade)")
        for t in tests
    ]
    calls = [call for test in split for call in test.calls]
    result = run_python(
        _GRADER
        % {
            "source": source,
            "calls": calls,
            "limit": MAX_RESULT_BYTES,
            "depth": MAX_RESULT_DEPTH,
        },
        dataclasses.replace(
            limits, max_output_bytes=max(limits.max_output_bytes, MAX_RESULT_BYTES + 64)
        ),
    )
    values = _results_of(result.stdout, len(calls))
    passed, offset = 0, 0
    for test in split:
        mine = values[offset : offset + len(test.calls)]
        offset += len(test.calls)
        passed += _check(test, mine)
    return passed, result


def _results_of(stdout: str, count: int) -> list[Any]:
    """Each call's decoded value, or a SubmissionRaised, from the last line of the grading run's stdout."""
    lines = stdout.strip().splitlines()
    failed: list[Any] = [SubmissionRaised("no result")] * count
    if not lines or len(lines[-1]) > MAX_RESULT_BYTES:
        return failed
    try:
        data = json.loads(lines[-1], parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return failed
    if type(data) is not list or len(data) != count:
        return failed
    values: list[Any] = []
    for item in data:
        try:
            if type(item) is list and len(item) == 2 and item[0] == "ok":
                values.append(decode_result(item[1]))
            else:
                values.append(SubmissionRaised(str(item)[:200]))
        except (ValueError, TypeError, RecursionError) as exc:
            values.append(SubmissionRaised(str(exc)))
    return values


def _reject_constant(name: str) -> Any:
    raise ParseError(f"bare {name} in a result")


def _check(test: SplitTest, values: list[Any]) -> bool:
    """Whether the test's check holds with ``values`` for its calls, evaluated here with the real builtins."""

    def result(index: int) -> Any:
        value = values[index]
        if isinstance(value, SubmissionRaised):
            raise value
        return value

    try:
        return bool(
            eval(test.check, {"__builtins__": builtins, "__result__": result})  # noqa: S307 (the task file's own expression)
        )
    except Exception:
        return False


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
    first in a response counts. Code runs in :func:`roll_async.workspaces.sandbox.run_python`
    (CPU time, memory, process, output limits; no network; a PID namespace per run
    with ``sandbox_isolation: namespaces``), so a submission cannot touch the host
    or another episode. Each test is one ``assert EXPR`` whose calls of the
    submission's functions run in the sandbox and whose comparison runs here on
    the plain values they returned (:func:`grade`); a test that cannot be split
    this way fails at load naming its task.
    """

    config_cls: ClassVar[type] = CodeEnvConfig
    multi_action: ClassVar[bool] = False

    def __init__(
        self, config: CodeEnvConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: CodeEnvConfig
        self.tasks = load_tasks(self.config.tasks_path, self.config.task_ids)
        self.split_tests = split_tasks(self.tasks)
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
        tests = self.split_tests[self.task["id"]]
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
