"""Score a shell agent's episode with the task's hidden tests, where the agent can no longer reach them.

The reward is the training signal, so nothing the agent did may decide it except the state of the
code it leaves: its processes are killed first, the test files are written again from the task
(its edits to them are discarded), and the tests run as a separate command as the workspace's
privileged user, with their own timeout. The reward comes from that command's exit code and from
the outcomes the verifier's pytest plugin prints with a nonce the agent never saw; no file in the
workspace is read (a reward file the agent wrote counts for nothing).
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from roll_async.envs.swe.task_spec import TaskSpec
from roll_async.errors import WorkspaceError
from roll_async.workspaces.interface import ExecResult, Workspace

RewardMode = Literal["binary", "fraction"]
#: The verifier's own folder in the workdir gets this prefix and a random suffix, so the agent cannot
#: have prepared it.
VERIFIER_DIR_PREFIX = ".roll_async_verifier_"
PLUGIN = "roll_async_pytest_summary"
PLUGIN_SOURCE = Path(__file__).parent / "data" / f"{PLUGIN}.py"
#: Printed (with exit status 97) when a SWE row's test_patch does not apply.
PATCH_FAILED = "ROLL_ASYNC_TEST_PATCH_FAILED"
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class VerifierResult:
    """The reward and why: ``detail`` is one line; ``outcomes`` maps test ids to passed/failed/skipped/error."""

    reward: float
    passed: bool
    detail: str
    exit_code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    outcomes: dict[str, str] = field(default_factory=dict)
    output: str = ""


def parse_outcomes(output: str, nonce: str) -> tuple[dict[str, str], int | None]:
    """Test outcomes and pytest's exit status from the plugin's lines that carry ``nonce`` (others are ignored)."""
    outcomes: dict[str, str] = {}
    status: int | None = None
    result_prefix, exit_prefix = (
        f"ROLL_ASYNC_RESULT {nonce} ",
        f"ROLL_ASYNC_EXIT {nonce} ",
    )
    for line in output.splitlines():
        if line.startswith(result_prefix):
            outcome, _, nodeid = line[len(result_prefix) :].partition(" ")
            outcomes[nodeid] = outcome
        elif (
            line.startswith(exit_prefix) and line[len(exit_prefix) :].strip().isdigit()
        ):
            status = int(line[len(exit_prefix) :].strip())
    return outcomes, status


def _environment(folder: str) -> str:
    """``export`` line for the tests: the plugin on the path, its nonce file, no auto-loaded pytest plugins."""
    return (
        f'export TESTS_DIR="$PWD/{folder}/tests" ROLL_ASYNC_NONCE_FILE="$PWD/{folder}/nonce" '
        f"ROLL_ASYNC_PYTEST_PLUGIN={PLUGIN} PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
        f'PYTHONPATH="$PWD/{folder}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    )


async def _prepare(
    workspace: Workspace, folder: str, nonce: str, tests_dir: Path | None
) -> None:
    """Kill the agent's processes, then write the verifier's folder: the plugin, an empty pytest.ini, the
    nonce and (Harbor) the task's tests, in one copy (one archive for the docker runtime)."""
    await workspace.kill_agent_processes()
    with tempfile.TemporaryDirectory(prefix="roll_async_verifier_") as staged:
        root = Path(staged)
        if tests_dir is not None:
            shutil.copytree(tests_dir, root / "tests", symlinks=False)
        (root / f"{PLUGIN}.py").write_bytes(PLUGIN_SOURCE.read_bytes())
        (root / "pytest.ini").write_bytes(b"[pytest]\n")
        (root / "nonce").write_bytes(nonce.encode())
        (root / "nonce").chmod(0o600)
        await workspace.copy_in(root, folder)


async def _restore_test_files(workspace: Workspace, task: TaskSpec, folder: str) -> str:
    """Write back the task's version of every file ``test_patch`` touches; the shell lines that finish the job.

    Those lines remove the touched files the task does not have (or take them from git when only the
    image holds the repository) and apply the patch, exiting 97 with :data:`PATCH_FAILED` if it does not.
    """
    targets = sorted({p for pair in _DIFF_PATHS.findall(task.test_patch) for p in pair})
    lines: list[str] = []
    for path in targets:
        original = task.files / path if task.files is not None else None
        quoted = shlex.quote(path)
        if original is not None and original.is_file():
            await workspace.write_file(path, original.read_bytes())
        elif original is not None:
            lines.append(f"rm -rf -- {quoted}")
        else:
            lines.append(
                f"git checkout -q HEAD -- {quoted} 2>/dev/null || rm -rf -- {quoted}"
            )
    await workspace.write_file(f"{folder}/test.patch", task.test_patch.encode())
    lines.append(
        # the ceiling keeps git from taking a repository above the workdir for the workdir's own
        f'GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply --whitespace=nowarn {folder}/test.patch '
        f"|| {{ echo {PATCH_FAILED}; exit 97; }}"
    )
    return "\n".join(lines) + "\n"


async def run_verifier(
    workspace: Workspace,
    task: TaskSpec,
    *,
    reward_mode: RewardMode = "binary",
    pytest_args: str = "--noconftest",
) -> VerifierResult:
    """Verify ``workspace`` against ``task``'s hidden tests; see the module docstring for what keeps it honest."""
    if task.format == "harbor" and task.tests_dir is None:
        raise WorkspaceError(f"task {task.task_id} has no tests folder to verify with")
    nonce = secrets.token_hex(16)
    folder = VERIFIER_DIR_PREFIX + secrets.token_hex(8)
    env = _environment(folder)
    harbor = task.tests_dir is not None and task.format == "harbor"
    try:
        await _prepare(workspace, folder, nonce, task.tests_dir if harbor else None)
        if harbor:
            command = env + 'bash "$TESTS_DIR/test.sh"'
        else:
            ids = " ".join(
                shlex.quote(t) for t in task.fail_to_pass + task.pass_to_pass
            )
            command = (
                await _restore_test_files(workspace, task, folder)
                + env
                + f'python3 -P -m pytest -c {folder}/pytest.ini --rootdir="$PWD" -o "pythonpath=$PWD" '
                f"-p no:cacheprovider -p {PLUGIN} {pytest_args} {ids}"
            )
    except (
        WorkspaceError
    ) as exc:  # a workspace the agent filled up (or broke) cannot pass
        return VerifierResult(
            0.0, False, f"the verifier could not write its files: {exc}"
        )
    result = await workspace.exec(
        command, timeout_s=task.verifier_timeout_s, user="root"
    )
    return score(task, result, nonce, reward_mode)


def score(
    task: TaskSpec, result: ExecResult, nonce: str, reward_mode: RewardMode
) -> VerifierResult:
    """The reward of one verifier run from its exit code and the plugin's nonce-tagged outcomes."""
    outcomes, status = parse_outcomes(result.output, nonce)

    def done(reward: float, detail: str) -> VerifierResult:
        return VerifierResult(
            reward,
            reward >= 1.0,
            detail,
            result.exit_code,
            result.timed_out,
            result.seconds,
            outcomes,
            result.output,
        )

    if result.timed_out:
        return done(
            0.0, f"the tests ran past their {task.verifier_timeout_s:g} s timeout"
        )
    if (
        task.format == "swe"
        and result.exit_code == 97
        and PATCH_FAILED in result.output
    ):
        return done(0.0, "the test patch did not apply")
    if task.format == "harbor":
        if result.exit_code != 0:
            return done(0.0, f"tests/test.sh exited {result.exit_code}")
        if task.summary_required:
            bad = sorted(n for n, o in outcomes.items() if o in ("failed", "error"))
            passed = sum(o == "passed" for o in outcomes.values())
            if status != 0 or bad or not passed:
                return done(
                    0.0,
                    f"the tests' own report does not show a clean pass (status {status}, "
                    f"{passed} passed, {len(bad)} failed)",
                )
        return done(1.0, "tests/test.sh passed")
    wanted = task.fail_to_pass + task.pass_to_pass
    if status is None:
        return done(0.0, f"pytest did not finish its session (exit {result.exit_code})")
    good = [t for t in wanted if outcomes.get(t) == "passed"]
    fraction = len(good) / len(wanted) if wanted else 0.0
    reward = fraction if reward_mode == "fraction" else float(fraction == 1.0)
    return done(
        reward, f"{len(good)}/{len(wanted)} of FAIL_TO_PASS + PASS_TO_PASS passed"
    )
