"""An agent session in a swe task's workspace: the handle agent code drives the shell through, and the episode's end.

``env_type: swe`` with ``agent: pkg.module:function`` plays each episode as an agent session (the model
calls go through the OpenAI-compatible endpoint, token-exact) inside the workspace a
:class:`~roll_async.envs.swe.env.SweEnv` started for the task: the same runtime lease, warm pool, limits
and agent deadline as a stepped swe episode, so a harness written for a shell (mini-swe-agent's
``DefaultAgent``) runs as it is. The agent function gets :class:`AgentWorkspace` as ``task.workspace``:
``execute`` (mini-swe-agent's Environment protocol: sync, from the harness's thread), ``aexecute`` (the
same from async code), ``get_template_vars``, ``serialize`` and the instruction; nothing of the task's
tests, verifier or reference solution. Its commands run as the workspace's agent user. When the agent
is done, :meth:`SweAgentEpisode.close` refuses further commands and cancels any still running, and the
episode runner calls :meth:`SweEnv.verify <roll_async.envs.swe.env.SweEnv.verify>` (agent processes
killed, tests restored, the verifier a separate exec as root, the reward read here): that verdict is the
episode's reward, whatever the agent returned, so no reward is one a policy can fake.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from roll_async.envs.base import build_config
from roll_async.envs.swe.env import SweConfig, SweEnv, percentile
from roll_async.envs.swe.verifier import VerifierResult
from roll_async.errors import (
    ConfigError,
    InvalidInputError,
    LifecycleError,
    WorkspaceError,
)

#: mini-swe-agent's submission marker: a command whose output starts with this line (exit 0) submits.
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: env_config keys of a stepped swe episode (the model acting through the env's own action format) that
#: mean nothing when an agent drives the workspace: key -> what to set instead.
STEPPED_ONLY_KEYS: dict[str, str] = {
    "max_steps": "custom_envs.<tag>.max_steps (the model calls an episode may make)",
    "action_format": "the agent's own reply format",
    "format_penalty": "the agent's own handling of malformed replies",
    "max_observation_tokens": "the agent's own observation templates",
    "max_calls_per_turn": "the agent's own loop",
}
#: Seconds a synchronous ``execute`` waits past its command's timeout for the event loop to answer.
SYNC_GRACE_S = 30.0


def agent_swe_config(env_config: Mapping[str, Any], where: str) -> SweConfig:
    """The :class:`SweConfig` of a tag whose agent drives the workspace; ConfigError naming a key that only a
    stepped episode uses (``where``: the config path of ``env_config``) or that SweConfig does not accept."""
    for key in env_config:
        if key in STEPPED_ONLY_KEYS:
            raise ConfigError(
                f"{where}.{key} is used only when the model acts through the swe env's own action format; "
                f"with an agent (custom_envs.<tag>.agent) the episode follows {STEPPED_ONLY_KEYS[key]}: "
                "remove the key"
            )
    config: SweConfig = build_config(SweConfig, dict(env_config), "swe")
    return config


@dataclass(frozen=True)
class AgentWorkspaceConfig:
    """The handle's settings (``config``, as mini-swe-agent's environments have; it serializes them)."""

    task_id: str
    #: The workspace's working directory, where commands start.
    cwd: str
    #: The longest one command may run (``env_config.command_timeout_s``); a longer ``timeout`` is cut to it.
    timeout: float
    #: The agent's whole time; commands past it are not run.
    agent_timeout_s: float
    runtime: str


class AgentWorkspace:
    """The episode's shell as agent code sees it: mini-swe-agent's Environment protocol, and the instruction.

    ``execute(action, cwd="", *, timeout=None)`` takes a command string (mini-swe-agent 1.x) or
    ``{"command": ...}`` (2.x) and returns ``{"output", "returncode", "exception_info"}``: returncode -1
    with the reason in ``exception_info`` when the command timed out, the agent's time is up or the
    workspace failed. It blocks, so call it from the harness's own thread (``asyncio.to_thread``, as a
    synchronous harness runs); on the event loop, ``await aexecute(...)``, which returns the same. When
    mini-swe-agent is installed, ``execute`` raises its ``Submitted`` on the submission marker, as its own
    environments do. Once the episode ends every call raises ``LifecycleError``.
    """

    def __init__(
        self,
        episode: SweAgentEpisode,
        instruction: str,
        config: AgentWorkspaceConfig,
    ) -> None:
        self._episode = episode
        self._loop = asyncio.get_running_loop()
        #: The task as the agent is to be told it (no action format: the harness brings its own).
        self.instruction = instruction
        self.config = config

    @property
    def task_id(self) -> str:
        return self.config.task_id

    async def aexecute(
        self,
        action: str | Mapping[str, Any],
        cwd: str = "",
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run one command as the agent; see the class docstring."""
        return await self._episode.run(_command_of(action), cwd, timeout)

    def execute(
        self,
        action: str | Mapping[str, Any],
        cwd: str = "",
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Run one command as the agent from a thread other than the event loop's; see the class docstring."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise LifecycleError(
                "AgentWorkspace.execute() blocks and was called on the event loop that runs the workspace; "
                "await workspace.aexecute(...) in async code, or run the harness in a thread (asyncio.to_thread)"
            )
        future = asyncio.run_coroutine_threadsafe(
            self.aexecute(action, cwd, timeout=timeout), self._loop
        )
        limit = min(timeout or self.config.timeout, self.config.timeout)
        try:
            output = future.result(timeout=limit + SYNC_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            output = _failed(
                f"no answer from the workspace within {limit + SYNC_GRACE_S:g} s"
            )
        _raise_if_submitted(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The handle's config and the host's ``platform.uname()`` fields (system, release, version, machine,
        which mini-swe-agent's templates name) and ``kwargs``, as its DockerEnvironment gives."""
        uname = {k: v for k, v in platform.uname()._asdict().items() if k != "node"}
        return {**asdict(self.config), **uname, **kwargs}

    def serialize(self) -> dict[str, Any]:
        """What mini-swe-agent saves of its environment with a trajectory."""
        return {
            "info": {
                "config": {
                    "environment": asdict(self.config),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }


class SweAgentEpisode:
    """The runner's side of one agent episode in a :class:`SweEnv`'s workspace, made after the env's ``reset``.

    Holds the handle it gives the agent (``handle``), runs the handle's commands within the limits a
    stepped episode has (each cut to ``command_timeout_s`` and to the agent time left), counts them, and
    at :meth:`close` stops them. ``busy`` and ``last_activity`` tell the episode runner that the agent is
    waiting on the shell, not idling. Verifying and closing the workspace are the env's (``SweEnv.verify``;
    an episode that fails instead has its env discarded, which closes the workspace).
    """

    def __init__(
        self, env: SweEnv, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if env.workspace is None or env.task is None or env.done:
            raise LifecycleError(
                "SweAgentEpisode needs a SweEnv whose reset() started a workspace; call reset() first"
            )
        self._env = env
        self._workspace = env.workspace
        self._clock = clock
        cfg, task = env.config, env.task
        self.deadline = env.deadline
        self.closed = False
        self.submitted = False
        self.last_activity = clock()
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._exec_s: list[float] = []
        #: The episode's timeline for the run report (``info["env_spans"]``'s shape): the workspace start
        #: the env's reset recorded, each command, and the verifier (:meth:`note_span`).
        self.spans: list[dict[str, Any]] = env.spans
        self._counts = {
            "commands": 0.0,
            "command_timeouts": 0.0,
            "output_truncations": 0.0,
        }
        self.handle = AgentWorkspace(
            self,
            task.instruction,
            AgentWorkspaceConfig(
                task_id=task.task_id,
                cwd="",
                timeout=float(cfg.command_timeout_s),
                agent_timeout_s=float(cfg.agent_timeout_s or task.agent_timeout_s),
                runtime=cfg.runtime,
            ),
        )

    @property
    def busy(self) -> bool:
        return bool(self._in_flight)

    async def run(
        self, command: str, cwd: str, timeout: float | None
    ) -> dict[str, Any]:
        """One command of the handle, as the agent (see :class:`AgentWorkspace`)."""
        if self.closed:
            raise LifecycleError(
                "this agent episode is over: its workspace is closed and runs no more commands"
            )
        left = self.deadline - time.monotonic()
        if left <= 0:
            return _failed(
                f"the agent's time ({self.handle.config.agent_timeout_s:g} s) is up; the command was not run"
            )
        cap = self.handle.config.timeout
        limit = max(
            0.1, min(cap if timeout is None else min(float(timeout), cap), left)
        )
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        began = time.time()
        try:
            result = await self._workspace.exec(
                command, timeout_s=limit, user="agent", workdir=cwd or None
            )
        except WorkspaceError as exc:
            return _failed(f"the workspace failed: {exc}")
        finally:
            if task is not None:
                self._in_flight.discard(task)
            self.last_activity = self._clock()
        self.note_span("exec", began)
        self._counts["commands"] += 1
        self._exec_s.append(result.seconds)
        self._counts["output_truncations"] += float(result.truncated)
        if result.timed_out:
            self._counts["command_timeouts"] += 1
            return _failed(f"the command timed out after {limit:g} s", result.output)
        output = {
            "output": result.output,
            "returncode": int(result.exit_code if result.exit_code is not None else -1),
            "exception_info": "",
        }
        if _submits(output):
            self.submitted = True
        return output

    def note_span(self, name: str, started_at: float) -> None:
        """A span of the episode from ``started_at`` (``time.time()``) until now."""
        self.spans.append(
            {"name": name, "started_at": started_at, "finished_at": time.time()}
        )

    def stop(self) -> list[asyncio.Task[Any]]:
        """Refuse further commands and cancel those still running (a harness thread may outlive its agent);
        the cancelled commands' tasks. No await, so it runs whole even in a cancelled episode's cleanup."""
        self.closed = True
        running = [t for t in self._in_flight if t is not asyncio.current_task()]
        for task in running:
            task.cancel()
        return running

    async def close(self) -> None:
        """:meth:`stop`, then wait until the cancelled commands ended (before the verifier runs)."""
        running = self.stop()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    def metrics(self, verdict: VerifierResult | None) -> dict[str, float]:
        """The episode's workspace figures as a stepped swe episode reports them, and the verdict's."""
        stats = self._workspace.stats
        metrics = {
            **self._counts,
            "workspace_start_s": stats.start_s,
            "workspace_pool_hit": float(stats.pool_hit),
            "exec_p50_s": percentile(self._exec_s, 0.5),
            "exec_p99_s": percentile(self._exec_s, 0.99),
            "agent_submitted": float(self.submitted),
            "success": float(bool(verdict and verdict.passed)),
        }
        if verdict is not None:
            metrics["verifier_seconds"] = verdict.seconds
            metrics["verifier_timed_out"] = float(verdict.timed_out)
        return metrics


def _command_of(action: str | Mapping[str, Any]) -> str:
    if isinstance(action, str):
        return action
    command = action.get("command") if isinstance(action, Mapping) else None
    if not isinstance(command, str):
        raise InvalidInputError(
            f"execute() takes a command string or {{'command': str}}, got {action!r}"
        )
    return command


def _failed(reason: str, output: str = "") -> dict[str, Any]:
    """A command that did not finish, in the form mini-swe-agent's environments give (returncode -1)."""
    return {"output": output, "returncode": -1, "exception_info": reason}


def _submits(output: Mapping[str, Any]) -> bool:
    lines = str(output.get("output", "")).lstrip().splitlines()
    return (
        bool(lines)
        and lines[0].strip() == SUBMIT_MARKER
        and output.get("returncode") == 0
    )


def _raise_if_submitted(output: dict[str, Any]) -> None:
    """mini-swe-agent (2.x) ends its loop when the environment raises ``Submitted``; its own environments
    raise it on the marker, and so does this handle when mini-swe-agent is installed."""
    if not _submits(output):
        return
    try:
        from minisweagent.exceptions import (
            Submitted,
        )  # optional: the harness that expects it brings it
    except ImportError:
        return
    submission = "".join(str(output["output"]).lstrip().splitlines(keepends=True)[1:])
    raise Submitted(
        {
            "role": "exit",
            "content": submission,
            "extra": {"exit_status": "Submitted", "submission": submission},
        }
    )
