"""Where log lines go: the console keeps the progress bar, one line per step and real errors; the rest goes to RUN_DIR/logs/.

vLLM, Ray and transformers print a lot from the driver and from worker
processes; routing every library's records through the project's own handlers,
and each Ray worker's output to a file, keeps the console readable while
nothing is lost.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from roll_async.errors import ConfigError

#: The environment variable that tells a Ray worker process where to write its log.
LOG_DIR_ENV = "ROLL_ASYNC_LOG_DIR"
#: Loggers whose records reach the console at ``logging.level``; other libraries only at ERROR.
OWN_LOGGERS = ("roll_async", "pipelines", "env_managers", "benchmarks", "__main__")
#: Libraries that attach their own console handlers; theirs are removed so the root handlers decide.
_SELF_HANDLING_LOGGERS = ("ray", "transformers", "vllm", "datasets", "wandb")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ConfigError(
            f"logging.level={level!r} is not a log level; use DEBUG, INFO, WARNING or ERROR"
        )
    return value


class _ConsoleFilter(logging.Filter):
    """Own loggers at the configured level; everything else at ERROR."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name.split(".")[0] in OWN_LOGGERS
        return record.levelno >= (self.level if own else logging.ERROR)


class _ProgressBarSafeHandler(logging.StreamHandler[TextIO]):
    """Writes through tqdm so a log line never breaks the progress bar (tqdm clears and redraws it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def _route_library_loggers() -> None:
    try:  # transformers' weight-loading progress bars are not ours to show (importing it adds its handler: first)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:
        pass
    for name in _SELF_HANDLING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def configure_console(level: str | int = "INFO") -> None:
    """The driver's console handler (replaces any earlier one of ours); safe to call again with a new level.

    Driver process: one root handler on the console that passes roll-async's own
    loggers (``roll_async``, ``pipelines``, ``env_managers``) at ``logging.level``
    and every other library (vLLM, Ray, transformers, ...) only at ERROR; one file
    handler, ``RUN_DIR/logs/driver.log``, that keeps everything at INFO and above.
    Ray and transformers install their own stream handlers on import; those are
    removed so their records reach the root handlers like everyone else's.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_roll_async_console", False):
            root.removeHandler(handler)
    handler = _ProgressBarSafeHandler(sys.stderr)
    handler._roll_async_console = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_ConsoleFilter(_level(level)))
    root.addHandler(handler)
    root.setLevel(min(logging.INFO, _level(level)))
    _route_library_loggers()


def attach_run_logs(run_root: str | Path, level: str | int = "WARNING") -> Path:
    """Console at ``level`` plus ``RUN_DIR/logs/driver.log`` (INFO and above of every logger); returns the logs dir."""
    log_dir = Path(run_root) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    configure_console(level)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_roll_async_file", False):
            root.removeHandler(handler)
            handler.close()
    file_handler = logging.FileHandler(log_dir / "driver.log")
    file_handler._roll_async_file = True  # type: ignore[attr-defined]
    file_handler.setFormatter(logging.Formatter(_FORMAT))
    file_handler.setLevel(min(logging.INFO, _level(level)))
    root.addHandler(file_handler)
    return log_dir


def setup_worker_process() -> None:
    """Ray worker_process_setup_hook: send this process's (and its children's) output to the run's log directory.

    Ray workers (engine actors, env workers) and their children (vLLM's
    EngineCore) print to their own stdout/stderr. ``init_ray(log_dir=...)`` turns
    off Ray's log_to_driver and installs :func:`setup_worker_process` as the
    worker_process_setup_hook: each worker process points its file descriptors 1
    and 2 at ``RUN_DIR/logs/ray-worker-<pid>.log``, so vLLM's engine lines (and
    anything a child process prints) land there. Errors from workers still reach
    the console: they come back as exceptions of the calls that failed.
    """
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    path = Path(log_dir) / f"ray-worker-{os.getpid()}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
