"""Errors that cross component boundaries, with one base class, so callers can catch roll-async's own failures.

Each message names what failed and the fix; errors that stay inside one module
are defined there.
"""

from __future__ import annotations

import traceback
from types import TracebackType


class RollAsyncError(Exception):
    """Base of every error below."""


# -- config ----------------------------------------------------------------------------------------------


class ConfigError(RollAsyncError, ValueError):
    """A config mistake; the message names the key and the fix."""


# -- user code -------------------------------------------------------------------------------------------


class UserCodeError(RollAsyncError):
    """User code a config names (an env class, an agent, a trainer) raised while roll-async imported or called it.

    Not a config mistake, so never shown as one: the original exception is the ``__cause__``, with its own
    traceback (:meth:`user_traceback`), and the message names the config key that pointed at the code and the
    original ``Type: message``. A path that names no module or attribute stays a :class:`ConfigError`.
    """

    def __init__(self, key: str, action: str, original: BaseException) -> None:
        self.key = key
        self.action = action
        self.original = original
        super().__init__(
            f"{key}: {action} raised {type(original).__name__}: {original} "
            "(an error in that code, not in the config; its traceback shows where)"
        )

    def __reduce__(self) -> tuple[type[UserCodeError], tuple[str, str, BaseException]]:
        # pickled by its fields (a Ray actor may raise it), not by the one message Exception would pass
        return (type(self), (self.key, self.action, self.original))

    def user_traceback(self) -> str:
        """The original exception with its traceback from the first frame outside roll-async: the user's frames."""
        tb = self.original.__traceback__
        first = tb
        while first is not None and _roll_async_frame(first):
            first = first.tb_next
        return "".join(
            traceback.format_exception(
                type(self.original), self.original, first if first is not None else tb
            )
        )


def _roll_async_frame(tb: TracebackType) -> bool:
    """A frame of roll-async itself or of importlib (the import machinery between it and a user module)."""
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in ("roll_async", "importlib")


# -- inputs ----------------------------------------------------------------------------------------------


class InvalidInputError(RollAsyncError, ValueError):
    """A function got an argument or data it cannot use (empty, mismatched, out of range); the message names it and what fits."""


class InvalidTypeError(RollAsyncError, TypeError):
    """An argument has the wrong type (not a mapping, a class without an env's methods); the message names it."""


class ParseError(RollAsyncError, ValueError):
    """Text that does not parse (a model's action or tool-call arguments, a sandbox's result); callers score it invalid."""


class LifecycleError(RollAsyncError, RuntimeError):
    """An object used out of order: before it was started, built or reset, or after it was shut down or its episode ended."""


# -- files -----------------------------------------------------------------------------------------------


class MissingFileError(RollAsyncError, FileNotFoundError):
    """A file or directory the run needs does not exist (a model, a checkpoint, a dataset, a run); the message says how to make it."""


class OutputExistsError(RollAsyncError, FileExistsError):
    """An output directory already holds files; nothing is overwritten, and the message asks for a new one."""


class DatasetError(RollAsyncError, ValueError):
    """A data file (an env dataset, a task file, a corpus) cannot be used; the message names the file and what it lacks."""


# -- engine ----------------------------------------------------------------------------------------------


class EngineStartupError(RollAsyncError, RuntimeError):
    """The engine could not start; the message names the option or path and the fix."""


class ReplicaDeadError(RollAsyncError, RuntimeError):
    """The engine replica's process is gone (its actor died); the router fails over to another replica."""


class NoLiveReplicaError(RollAsyncError, RuntimeError):
    """Every engine replica died; the rollout cannot continue."""


class WeightSyncError(RollAsyncError, RuntimeError):
    """An engine replica could not take a weight update cleanly; serving on would reuse KV of the old weights."""


# -- rollout ---------------------------------------------------------------------------------------------


class EngineRequestError(RollAsyncError, RuntimeError):
    """An engine request failed (aborted or errored); a turn's request that still fails after its retries ends the rollout loop."""


class EnvCallError(RollAsyncError, RuntimeError):
    """make_env / reset / step raised or timed out."""


class RolloutFatalError(RollAsyncError, RuntimeError):
    """The rollout cannot continue; the message carries the root cause."""


class QueueActorDeadError(RollAsyncError, RuntimeError):
    """The GroupQueueActor's process is gone: no episode can be handed over or served."""


# -- envs ------------------------------------------------------------------------------------------------


class EnvServiceError(RollAsyncError, RuntimeError):
    """The server answered that the env (or the request) failed; the episode ends ``env_error``."""

    def __init__(
        self, message: str, *, kind: str = "env_error", status: int = 500
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


class EnvServiceUnavailable(RollAsyncError, RuntimeError):
    """No env server of a tag answers (transport errors after the retries); the rollout cannot go on."""


class EnvLibraryError(RollAsyncError, RuntimeError):
    """An env library's env (GEM, OpenEnv) raised while it was built, reset or stepped, or its server broke the
    session; the message names the env_type, the call and the library's error. In a rollout the episode ends
    ``env_error``; at ``--check`` the message names the ``custom_envs`` tag."""


class TaskGenerationError(RollAsyncError, RuntimeError):
    """An env could not draw a task with its config (no solvable room, too few distinct problems); the message names the keys."""


# -- prompts ---------------------------------------------------------------------------------------------


class ChatTemplateError(RollAsyncError, ValueError):
    """The chat template cannot be used incrementally (the message names the behaviour and the fix)."""


class VisionInputError(RollAsyncError, ValueError):
    """An observation's images cannot be used (wrong mode, count mismatch, rejected by the processor)."""


# -- trainer ---------------------------------------------------------------------------------------------


class NonFiniteLossError(RollAsyncError, RuntimeError):
    """A NaN/inf loss or gradient norm: the optimizer was not stepped; the run should stop at the last good checkpoint."""

    def __init__(
        self, step: int, traj_ids: list[str], what: str, detail: str = ""
    ) -> None:
        self.step = step
        self.traj_ids = list(traj_ids)
        self.what = what
        shown = ", ".join(self.traj_ids[:4]) + (
            f" (+{len(self.traj_ids) - 4} more)" if len(self.traj_ids) > 4 else ""
        )
        super().__init__(
            f"non-finite {what} at step {step}{f' ({detail})' if detail else ''}; batch trajectories: "
            f"{shown or '(none)'}. The optimizer step was skipped, so the weights are those before this update; "
            "stop the run and resume from the last good checkpoint (check rewards and engine logprobs of these "
            "trajectories, or lower trainer.lr)"
        )


class TrainerRankTimeoutError(RollAsyncError, RuntimeError):
    """Some fsdp2 ranks did not answer a call within trainer.rank_call_timeout_s: hung, so the group was stopped.

    Without it a rank stuck outside a collective (a deadlock, a stuck filesystem) would hang the run
    silently; torch.distributed's own timeout only covers collectives.
    """

    def __init__(
        self, method: str, ranks: list[int], num_ranks: int, waited_s: float
    ) -> None:
        self.method = method
        self.ranks = list(ranks)
        self.waited_s = waited_s
        super().__init__(
            f"trainer ranks {self.ranks} of {num_ranks} did not answer {method} within {waited_s:.1f} s "
            "(trainer.rank_call_timeout_s); the ranks were stopped. Raise trainer.rank_call_timeout_s if a "
            f"{method} is legitimately this slow; otherwise a rank hung outside a collective (deadlock, stuck "
            "filesystem): check the ranks' logs, then resume from the last checkpoint"
        )


class CheckpointError(RollAsyncError, RuntimeError):
    """A checkpoint does not fit the model it is loaded into (missing or unexpected weights, no LoRA adapter)."""


class SftDivergedError(RollAsyncError, FloatingPointError):
    """The SFT warm-up's loss became NaN or inf; the message names the step and the learning rate to lower."""


# -- runtime ---------------------------------------------------------------------------------------------


class UnsupportedHostError(RollAsyncError, RuntimeError):
    """This machine cannot do what an option asks (sandbox namespaces, vLLM's bfloat16 CPU kernels); the message names the fallback."""


class CallTimeoutError(RollAsyncError, TimeoutError):
    """A call overran its time limit; a TimeoutError like asyncio's, so one handler covers both."""


class MethodNotServedError(RollAsyncError, AttributeError):
    """An actor was called over ZMQ with a method it does not serve: the remote side of getattr's AttributeError."""


class ZmqConnectError(RollAsyncError, RuntimeError):
    """An actor's call socket failed: it did not answer (a port blocked between nodes, most likely) or could not bind again."""


class CallConnectionLost(RollAsyncError, ConnectionError):
    """A call's connection to a live actor dropped before its answer came: the answer went to the old
    connection and is lost, so the call fails instead of waiting forever; an idempotent call may be retried."""


class WorkspaceError(RollAsyncError, RuntimeError):
    """An agent's workspace (a container or a local sandbox) died, stopped answering or could not start."""
