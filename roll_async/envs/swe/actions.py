"""What a shell agent can do in one turn, in either action format, and how its observations are cut to size.

``tools``: OpenAI function tools (``bash``, a ``str_replace_editor`` with view/create/str_replace as
in SWE-agent, ``submit``) that the rollout declares through the chat template and parses with the
model's tool parser. ``text``: one fenced bash block per reply, the mini-swe-agent convention,
where the block ``submit`` (or mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``)
ends the episode. Both come out as the same :class:`Command` list, so the env runs one loop. The
editor runs as a small Python program in the workspace, as the agent, so it can touch nothing the
agent's own shell could not.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from roll_async.envs.tool_actions import decode_tool_calls, function_tool

ActionFormat = Literal["tools", "text"]
SUBMIT_WORDS = ("submit", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
_FENCE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)
_EDITOR_COMMANDS = ("view", "create", "str_replace")

_EDITOR = r"""
import base64, json, os, sys
a = json.loads(base64.b64decode(sys.argv[1]))
cmd, path = a.get("command"), a.get("path") or ""
def fail(msg):
    print(msg)
    sys.exit(1)
if not path:
    fail("path is required")
if cmd == "view":
    if os.path.isdir(path):
        base = path.rstrip("/").count("/")
        for top, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if top.rstrip("/").count("/") - base >= 2:
                dirs[:] = []
            for name in sorted(files):
                if not name.startswith("."):
                    print(os.path.join(top, name))
        sys.exit(0)
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    lo, hi = 1, len(lines)
    if a.get("view_range"):
        lo, hi = int(a["view_range"][0]), int(a["view_range"][1])
        hi = len(lines) if hi == -1 else min(hi, len(lines))
    for i in range(max(1, lo), hi + 1):
        print(f"{i:6d}\t{lines[i - 1]}")
elif cmd == "create":
    if a.get("file_text") is None:
        fail("file_text is required for create")
    if os.path.exists(path):
        fail(f"{path} already exists; edit it with str_replace")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(a["file_text"])
    print(f"created {path}")
elif cmd == "str_replace":
    old, new = a.get("old_str") or "", a.get("new_str") or ""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    n = text.count(old) if old else 0
    if n != 1:
        fail(f"old_str must occur exactly once in {path}; it occurs {n} times")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))
    print(f"edited {path}")
else:
    fail(f"unknown command {cmd!r}; use view, create or str_replace")
"""


@dataclass(frozen=True)
class Command:
    """One thing to do: a shell command to run as the agent, or the submission that ends the episode."""

    kind: Literal["shell", "submit"]
    shell: str = ""
    #: What the agent called (``bash``, ``str_replace_editor view``), for observations and metrics.
    label: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """The commands of one reply, or the format error that made it unusable (then ``commands`` is empty)."""

    commands: tuple[Command, ...] = ()
    error: str = ""
    dropped: int = 0


def swe_tools() -> list[dict[str, Any]]:
    """The function tools of ``action_format: tools``."""
    return [
        function_tool(
            "bash",
            "Run a bash command in the working directory (a fresh shell each time: cd and variables do not carry "
            "over, files do). Returns the exit code and output.",
            {"command": {"type": "string", "description": "the command line"}},
            ["command"],
        ),
        function_tool(
            "str_replace_editor",
            "View a file (with line numbers) or a directory, create a new file, or replace one exact, unique "
            "occurrence of old_str with new_str in a file.",
            {
                "command": {"type": "string", "enum": list(_EDITOR_COMMANDS)},
                "path": {"type": "string"},
                "file_text": {
                    "type": "string",
                    "description": "create: the file's content",
                },
                "old_str": {
                    "type": "string",
                    "description": "str_replace: the exact text to replace",
                },
                "new_str": {
                    "type": "string",
                    "description": "str_replace: the replacement",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "view: [first line, last line] (-1: to the end)",
                },
            },
            ["command", "path"],
        ),
        function_tool(
            "submit",
            "Submit your work: the hidden tests run and the episode ends.",
            {},
            [],
        ),
    ]


def editor_shell(arguments: dict[str, Any]) -> str:
    """The shell command that runs the editor program on ``arguments`` (base64, so no quoting can break it)."""
    program = base64.b64encode(_EDITOR.encode()).decode()
    payload = base64.b64encode(json.dumps(arguments).encode()).decode()
    return f"python3 -I -c \"import base64; exec(base64.b64decode('{program}'))\" {payload}"


def parse_tools(action_text: str, max_calls: int) -> ParsedTurn:
    """The calls of a tools-format action (``encode_tool_calls`` text), at most ``max_calls``, up to a submit."""
    calls = decode_tool_calls(action_text)
    if not calls:
        return ParsedTurn(error="no tool call; call bash, str_replace_editor or submit")
    commands: list[Command] = []
    for name, arguments in calls[:max_calls]:
        if name == "submit":
            commands.append(Command("submit", label="submit"))
            break
        if name == "bash":
            command = arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                return ParsedTurn(error="bash needs a non-empty 'command' string")
            commands.append(Command("shell", command, "bash"))
        elif name == "str_replace_editor":
            sub = arguments.get("command")
            if sub not in _EDITOR_COMMANDS or not isinstance(
                arguments.get("path"), str
            ):
                return ParsedTurn(
                    error=f"str_replace_editor needs command (one of {', '.join(_EDITOR_COMMANDS)}) and path"
                )
            commands.append(
                Command("shell", editor_shell(arguments), f"str_replace_editor {sub}")
            )
        else:
            return ParsedTurn(
                error=f"unknown tool {name!r}; use bash, str_replace_editor or submit"
            )
    return ParsedTurn(tuple(commands), dropped=max(0, len(calls) - max_calls))


def parse_text(action_text: str) -> ParsedTurn:
    """The one fenced bash block of a text-format reply; none or several is a format error."""
    blocks = _FENCE.findall(action_text or "")
    if len(blocks) != 1:
        return ParsedTurn(
            error=f"found {len(blocks)} bash code blocks; reply with exactly one ```bash ... ``` block "
            "(the block `submit` ends the task)"
        )
    command = blocks[0].strip()
    if not command:
        return ParsedTurn(error="the bash block is empty")
    if command in SUBMIT_WORDS:
        return ParsedTurn((Command("submit", label="submit"),))
    return ParsedTurn((Command("shell", command, "bash"),))


def instruction_text(
    task_instruction: str, action_format: ActionFormat, max_steps: int
) -> str:
    """The first user turn: the task, then how to act in this format."""
    if action_format == "tools":
        how = (
            "Work with the tools: `bash` runs a command in your working directory, `str_replace_editor` views "
            "and edits files, and `submit` ends the task and runs the hidden tests."
        )
    else:
        how = (
            "Each reply must contain exactly one bash code block (```bash ... ```) with the command to run in "
            "your working directory; you will see its output. Each command runs in a fresh shell (cd and "
            "variables do not carry over, files do). When you are done, reply with a block holding only `submit`."
        )
    return (
        f"{task_instruction}\n\nThe files are in your current working directory. {how} "
        f"You have at most {max_steps} turns."
    )
