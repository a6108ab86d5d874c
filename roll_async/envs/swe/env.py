"""``env_type: swe``: an agent fixes a repository or a shell setup in a real shell, scored by hidden tests.

SWE and terminal tasks train the skill of acting in a system through commands, reading their
output and stopping when done, which single-answer envs cannot. Each episode gets its own
workspace from the configured runtime (``runtime: local``, the namespace sandbox, or ``docker``),
starting from the task's files; the model acts through function tools or one fenced bash block per
reply; the episode ends at ``submit``, at ``max_steps`` or when the task's agent time runs out,
and then :func:`~roll_async.envs.swe.verifier.run_verifier` scores it. Each command's output is cut
to ``max_observation_tokens`` of the policy's tokens (``observation_budget``), and the workspace
start, each command and the verifier are reported as ``info["env_spans"]`` for the run report. The
env's calls are ``async`` (the rollout awaits them), so one process drives many shells at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from roll_async.envs.base import EnvConfig, build_config
from roll_async.envs.swe.actions import (
    ActionFormat,
    Command,
    ParsedTurn,
    instruction_text,
    parse_text,
    parse_tools,
    swe_tools,
)
from roll_async.envs.swe.harbor import load_harbor_tasks
from roll_async.envs.swe.observation_budget import cut_to_budget
from roll_async.envs.swe.shipped import shipped_tasks_dir, write_task_set
from roll_async.envs.swe.swe_rows import load_swe_rows, swe_columns
from roll_async.envs.swe.task_spec import TaskSpec
from roll_async.envs.swe.verifier import RewardMode, VerifierResult, run_verifier
from roll_async.errors import ConfigError, DatasetError, LifecycleError
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.workspaces.factory import RUNTIME_KINDS, sweep_run
from roll_async.workspaces.interface import (
    ExecResult,
    RuntimeKind,
    Workspace,
    WorkspaceRuntime,
    WorkspaceSpec,
)
from roll_async.workspaces.shared import RuntimeLease, acquire_runtime


@dataclass
class SweConfig(EnvConfig):
    """``custom_envs.<Tag>.env_config`` of ``env_type: swe``."""

    #: Keys of older configs, and what to set instead (``build_config`` names it).
    replaced_keys: ClassVar[dict[str, str]] = {
        "max_observation_chars": "max_observation_tokens (observations are cut to the policy's tokens; the "
        "raw output's cap is runtime_config.max_output_bytes (local) or output_cap_bytes (docker))",
    }

    max_steps: int = 30
    format_penalty: float = 0.0
    #: A Harbor task folder (or a folder of them), or a JSONL/parquet file of SWE rows; None: the shipped set.
    tasks_path: str | None = None
    #: ``auto``: a folder is Harbor, a file is SWE rows.
    task_format: Literal["auto", "harbor", "swe"] = "auto"
    #: SWE rows: field -> column name overrides (see ``swe_rows.SweColumns``).
    columns: dict[str, str] = field(default_factory=dict)
    #: Only these task ids (Harbor: the folder name or [task] name; SWE: instance_id).
    task_ids: list[str] | None = None
    action_format: ActionFormat = "tools"
    runtime: RuntimeKind = "local"
    #: The runtime's own settings (local: ``workspaces.local.LocalRuntimeConfig``; docker:
    #: ``workspaces.docker.DockerRuntimeConfig``, whose ``run_id`` the training driver fills in). The envs
    #: of one worker process with the same settings share one runtime (``workspaces.shared``).
    runtime_config: dict[str, Any] = field(default_factory=dict)
    #: Longest one command may run (also cut to the agent time left).
    command_timeout_s: float = 60.0
    #: The agent's whole time; None: the task's ``[agent] timeout_sec``.
    agent_timeout_s: float | None = None
    #: Each command's output is cut to this many of the policy's tokens, head and tail kept (plus a marker).
    max_observation_tokens: int = 1024
    #: Tool calls run per turn; more are dropped and counted.
    max_calls_per_turn: int = 4
    #: SWE rows: ``binary`` (1 only if every FAIL_TO_PASS and PASS_TO_PASS test passes) or ``fraction``.
    reward: RewardMode = "binary"
    #: SWE rows: extra pytest arguments; ``--noconftest`` keeps a conftest.py the agent wrote out of the tests.
    verifier_pytest_args: str = "--noconftest"

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "task_format": (self.task_format, ("auto", "harbor", "swe")),
            "action_format": (self.action_format, ("tools", "text")),
            "runtime": (self.runtime, RUNTIME_KINDS),
            "reward": (self.reward, ("binary", "fraction")),
        }
        for key, (value, allowed) in checks.items():
            if value not in allowed:
                raise ConfigError(
                    f"env_config.{key}={value!r} is not one of {list(allowed)}"
                )
        for key in (
            "command_timeout_s",
            "max_observation_tokens",
            "max_calls_per_turn",
        ):
            if float(getattr(self, key)) <= 0:
                raise ConfigError(
                    f"env_config.{key} must be > 0, got {getattr(self, key)!r}"
                )
        if self.agent_timeout_s is not None and float(self.agent_timeout_s) <= 0:
            raise ConfigError(
                f"env_config.agent_timeout_s must be > 0, got {self.agent_timeout_s!r}"
            )
        if self.tasks_path is not None and not Path(self.tasks_path).exists():
            raise ConfigError(
                f"env_config.tasks_path={self.tasks_path!r} does not exist; give a Harbor task folder or a "
                "JSONL/parquet file of SWE rows, or leave it unset for the shipped tasks"
            )
        swe_columns(self.columns)


def load_tasks(config: SweConfig) -> list[TaskSpec]:
    """The tasks ``config`` names, in a fixed order, filtered by ``task_ids``."""
    fmt = config.task_format
    if config.tasks_path is None:
        root = shipped_tasks_dir()
        path = root / "swe" / "tasks.jsonl" if fmt == "swe" else root / "harbor"
    else:
        path = Path(config.tasks_path)
    if fmt == "auto":
        fmt = "harbor" if path.is_dir() else "swe"
    tasks = (
        load_harbor_tasks(path)
        if fmt == "harbor"
        else load_swe_rows(path, swe_columns(config.columns))
    )
    if config.task_ids is not None:
        known = {t.task_id: t for t in tasks}
        missing = [i for i in config.task_ids if i not in known]
        if missing:
            raise DatasetError(
                f"env_config.task_ids: {missing[0]!r} is not a task of {path}; some ids: "
                f"{', '.join(sorted(known)[:5])}"
            )
        tasks = [known[i] for i in config.task_ids]
    return tasks


def workspace_spec(task: TaskSpec) -> WorkspaceSpec:
    """The workspace ``task`` runs in: its image (or Dockerfile, built once by its content hash), its
    starting files and the limits of its task.toml (``[environment]`` cpus, memory_mb, storage_mb, network)."""
    return WorkspaceSpec(
        image=task.image,
        files=task.files,
        dockerfile=task.dockerfile,
        cpus=task.cpus,
        memory_mb=task.memory_mb,
        network=task.network,
        disk_mb=task.storage_mb,
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


class SweEnv:
    """An agent in a shell; see the module docstring. One episode at a time per instance."""

    config_cls: ClassVar[type] = SweConfig

    def __init__(
        self,
        config: SweConfig | dict[str, Any] | None = None,
        *,
        workspace_runtime: WorkspaceRuntime | None = None,
        tokenizer: ChatTokenizer | None = None,
        **kwargs: Any,
    ) -> None:
        self.config: SweConfig = build_config(
            SweConfig, config or kwargs or None, "swe"
        )
        self._tasks: list[TaskSpec] | None = None
        self._lease: RuntimeLease | None = None
        #: A runtime the caller owns and shuts down (a benchmark's, shared by its envs); None: this env
        #: leases the worker's shared runtime for its config.
        self._own_runtime = workspace_runtime
        self.workspace: Workspace | None = None
        self.task: TaskSpec | None = None
        self.done = True
        self.num_steps = 0
        self.deadline = 0.0
        self.verdict: VerifierResult | None = None
        self._counts: dict[str, float] = {}
        #: Seconds of each command the agent ran this episode (for the exec time percentiles).
        self._exec_s: list[float] = []
        self._truncations = 0
        #: Counts the observation budget in the policy's tokens; None: in bytes (see ``observation_budget``).
        self._tokenizer = tokenizer
        #: The current call's workspace start, commands and verifier (``info["env_spans"]``).
        self._spans: list[dict[str, Any]] = []

    def use_tokenizer(self, tokenizer: ChatTokenizer) -> None:
        """The policy's tokenizer, from the EnvManager's env builder: the observation budget counts its tokens."""
        self._tokenizer = tokenizer

    # -- tasks ---------------------------------------------------------------------------------
    @property
    def tasks(self) -> list[TaskSpec]:
        if self._tasks is None:
            self._tasks = load_tasks(self.config)
        return self._tasks

    @property
    def num_tasks(self) -> int:
        """Distinct tasks; ``make-env-dataset`` keeps its seeds distinct modulo this."""
        return len(self.tasks)

    @classmethod
    def dataset_files(cls, env_config: dict[str, Any], out: Path) -> dict[str, Any]:
        """``make-env-dataset --env swe``: write the shipped tasks next to the parquet and point the rows at them."""
        if env_config.get("tasks_path"):
            return env_config
        folder = out.parent / f"{out.stem}_tasks"
        write_task_set(folder)
        sub = "swe/tasks.jsonl" if env_config.get("task_format") == "swe" else "harbor"
        return {**env_config, "tasks_path": str((folder / sub).resolve())}

    @classmethod
    def run_env_config(cls, env_config: dict[str, Any], run_id: str) -> dict[str, Any]:
        """The env_config of this tag's envs in run ``run_id``: docker containers get the run's label
        (``runtime_config.run_id``, unless the config names one), so the driver can sweep them."""
        if env_config.get("runtime") != "docker":
            return env_config
        runtime_config = dict(env_config.get("runtime_config") or {})
        runtime_config.setdefault("run_id", run_id)
        return {**env_config, "runtime_config": runtime_config}

    @classmethod
    def end_run(cls, env_config: dict[str, Any], run_id: str) -> dict[str, float]:
        """After every env of the run closed: remove the run's containers still there and count them
        (``containers_leaked``: 0 when every runtime shut down cleanly)."""
        if env_config.get("runtime") != "docker":
            return {}
        run = str((env_config.get("runtime_config") or {}).get("run_id") or run_id)
        return {"containers_leaked": float(sweep_run("docker", run))}

    def tools(self) -> list[dict[str, Any]] | None:
        return swe_tools() if self.config.action_format == "tools" else None

    # -- episode -------------------------------------------------------------------------------
    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start the task ``seed`` picks (``seed % num_tasks``) in a fresh workspace."""
        await self._close_workspace()
        task = self.tasks[int(seed) % len(self.tasks)]
        self._spans = []
        began = time.time()
        self.workspace = await self._runtime().start(workspace_spec(task))
        # the span's name says whether the container came warm from the pool or started cold
        warm = self.workspace.stats.pool_hit
        self._span("workspace_start_warm" if warm else "workspace_start_cold", began)
        self.task, self.done, self.num_steps, self.verdict = task, False, 0, None
        self._counts = {"commands": 0.0, "command_timeouts": 0.0, "format_errors": 0.0}
        self._exec_s = []
        self._truncations = 0
        agent_s = self.config.agent_timeout_s or task.agent_timeout_s
        self.deadline = time.monotonic() + float(agent_s)
        info: dict[str, Any] = {
            "instruction": instruction_text(
                task.instruction, self.config.action_format, self.config.max_steps
            ),
            "seed": int(seed),
            "task_id": task.task_id,
            "env_spans": self._spans,
        }
        tools = self.tools()
        if tools:
            info["tools"] = tools
        return "Your working directory is ready.", info

    async def step(
        self, action_text: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the reply's commands; at submit, max_steps or the agent deadline, verify and give the reward."""
        if self.done or self.workspace is None or self.task is None:
            raise LifecycleError(
                "SweEnv.step() called before reset() or after the episode ended; call reset()"
            )
        self.num_steps += 1
        self._spans = []
        cfg = self.config
        parsed: ParsedTurn = (
            parse_tools(action_text, cfg.max_calls_per_turn)
            if cfg.action_format == "tools"
            else parse_text(action_text)
        )
        parts: list[str] = []
        submitted = False
        reward = 0.0
        if parsed.error:
            self._counts["format_errors"] += 1
            reward += cfg.format_penalty
            parts.append(f"Invalid action: {parsed.error}")
        for command in parsed.commands:
            if command.kind == "submit":
                submitted = True
                break
            if time.monotonic() >= self.deadline:
                break
            parts.append(await self._run(command, len(parsed.commands) > 1))
        if parsed.dropped:
            parts.append(
                f"({parsed.dropped} tool calls past the limit of {cfg.max_calls_per_turn} were not run)"
            )
        out_of_time = time.monotonic() >= self.deadline
        terminated = submitted
        truncated = not submitted and (out_of_time or self.num_steps >= cfg.max_steps)
        episode: dict[str, float] = {}
        if terminated or truncated:
            episode = self._episode_metrics()
            verdict = await self.verify()
            reward += verdict.reward
            why = (
                "submitted"
                if submitted
                else "out of time"
                if out_of_time
                else "out of turns"
            )
            parts.append(f"Episode over ({why}). {verdict.detail}.")
        info = {
            "metrics": {**self._metrics(not parsed.error), **episode},
            "format_error": parsed.error or None,
            "env_spans": self._spans,
        }
        observation = "\n\n".join(parts) or "(no output)"
        return observation, float(reward), terminated, truncated, info

    async def _run(self, command: Command, labelled: bool) -> str:
        """One command as the agent, its output cut to the observation budget."""
        assert self.workspace is not None
        timeout = min(
            self.config.command_timeout_s, max(0.1, self.deadline - time.monotonic())
        )
        began = time.time()
        result = await self.workspace.exec(
            command.shell, timeout_s=timeout, user="agent"
        )
        self._span("exec", began)
        self._counts["commands"] += 1
        if result.timed_out:
            self._counts["command_timeouts"] += 1
            head = f"[timed out after {timeout:.0f} s]"
        else:
            head = f"[exit code {result.exit_code}]"
        if labelled:
            head = f"{command.label}: {head}"
        text, cut = cut_to_budget(
            f"{head}\n{result.output}".rstrip(),
            self.config.max_observation_tokens,
            self._tokenizer,
        )
        self._note(result, cut)
        return text

    async def verify(self) -> VerifierResult:
        """End the episode: score the workspace with the task's hidden tests, then close it (also on error).

        What :meth:`step` does at submit, max_steps or the deadline, and what an agent session that drove
        the workspace itself ends with (``roll_async.envs.swe.agent_workspace``), so both score alike.
        """
        if self.done or self.workspace is None or self.task is None:
            raise LifecycleError(
                "SweEnv.verify() called before reset() or after the episode ended; call reset()"
            )
        began = time.time()
        try:
            # the verdict is set before the workspace closes: a close hook may read it
            verdict = await run_verifier(
                self.workspace,
                self.task,
                reward_mode=self.config.reward,
                pytest_args=self.config.verifier_pytest_args,
            )
            self.verdict = verdict
        finally:
            self.done = True
            self._span("verify", began)
            await self._close_workspace()
        return verdict

    def _note(self, result: ExecResult, cut: bool) -> None:
        """One command's time, and whether its output was cut (by the runtime's byte cap or the token budget)."""
        self._exec_s.append(result.seconds)
        self._truncations += int(result.truncated or cut)

    @property
    def spans(self) -> list[dict[str, Any]]:
        """The current call's spans (what ``info["env_spans"]`` carries), e.g. the workspace start after reset."""
        return list(self._spans)

    def _span(self, name: str, started_at: float) -> None:
        """A span of this call from ``started_at`` (``time.time()``) until now, for ``info["env_spans"]``."""
        self._spans.append(
            {"name": name, "started_at": started_at, "finished_at": time.time()}
        )

    def _episode_metrics(self) -> dict[str, float]:
        """What the episode's workspace cost, reported once, with the step that ends the episode.

        How its workspace started (seconds, warm from a pool or not), its commands' time (p50, p99),
        the outputs cut (to the runtime's cap or the token budget), and the workspaces the runtime holds
        now (this one included).
        """
        assert self.workspace is not None
        stats = self.workspace.stats
        return {
            "workspace_start_s": stats.start_s,
            "workspace_pool_hit": float(stats.pool_hit),
            "exec_p50_s": percentile(self._exec_s, 0.5),
            "exec_p99_s": percentile(self._exec_s, 0.99),
            "output_truncations": float(self._truncations),
            "workspaces_alive": float(self._runtime().alive()),
        }

    def _metrics(self, valid: bool) -> dict[str, float | bool]:
        verdict = self.verdict
        metrics: dict[str, float | bool] = {
            "action_is_valid": valid,
            "success": bool(verdict and verdict.passed),
            **self._counts,
        }
        if verdict is not None:
            metrics["verifier_seconds"] = verdict.seconds
            metrics["verifier_timed_out"] = verdict.timed_out
        return metrics

    def _runtime(self) -> WorkspaceRuntime:
        """The runtime episodes start in: the caller's, else this env's lease of the worker's shared one."""
        if self._own_runtime is not None:
            return self._own_runtime
        if self._lease is None:
            self._lease = acquire_runtime(
                self.config.runtime, self.config.runtime_config
            )
        return self._lease.runtime

    async def _close_workspace(self) -> None:
        workspace, self.workspace = self.workspace, None
        if workspace is not None:
            await workspace.close()

    async def close(self) -> None:
        """Close the episode's workspace and give back this env's share of the runtime; safe to call twice."""
        try:
            await self._close_workspace()
        finally:
            lease, self._lease = self._lease, None
            if lease is not None:
                await lease.release()
