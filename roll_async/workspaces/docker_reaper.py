"""Nothing leaks: the labels every workspace container carries, and the sweeps that remove them.

A container outlives the process that started it unless someone removes it, so each one is labelled
with its run and its owner (the pid, the pid's start time and the host of the process holding the
runtime). The owner removes its own at shutdown, from ``atexit`` and from a SIGTERM/SIGHUP handler
that chains to the one it replaced (a fresh API client there, so a signal that lands inside a Docker
call cannot deadlock on that call's connection), and every new runtime first removes the containers of
owners that died on its host (kill -9, an OOM-killed worker): a pid that is gone, or that now belongs
to a process started at another time, is dead. The driver of a multi-process run can sweep a whole
run with :func:`remove_run`.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

LABEL_RUN = "roll-async.run"
LABEL_PID = "roll-async.owner-pid"
LABEL_HOST = "roll-async.owner-host"
LABEL_START = "roll-async.owner-start"
LABEL_ROLE = "roll-async.role"
ROLE = "workspace"


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def owner_labels(run_id: str) -> dict[str, str]:
    """The labels that tie a container to this run and this process."""
    pid = os.getpid()
    return {
        LABEL_RUN: run_id,
        LABEL_PID: str(pid),
        LABEL_HOST: socket.gethostname(),
        LABEL_START: str(process_start_ticks(pid) or 0),
        LABEL_ROLE: ROLE,
    }


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process a container's labels name still runs (always True for another host's)."""
    if labels.get(LABEL_HOST) != socket.gethostname():
        return True
    try:
        pid = int(labels.get(LABEL_PID, ""))
        started = int(labels.get(LABEL_START, "0"))
    except ValueError:
        return True  # not ours to judge
    ticks = process_start_ticks(pid)
    return ticks is not None and (started == 0 or ticks == started)


def _status(exc: Exception) -> int | None:
    status: int | None = getattr(getattr(exc, "response", None), "status_code", None)
    return status


def remove_container(api: Any, container_id: str, wait_s: float = 10.0) -> bool:
    """Remove a container and its volumes; False when it was gone already. When another removal of it
    is under way (409) this waits until it is gone, so a count right after sees it no more."""
    try:
        api.remove_container(container_id, force=True, v=True)
        return True
    except Exception as exc:
        if _status(exc) == 404:
            return False
        if _status(exc) != 409:
            raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            api.inspect_container(container_id)
        except Exception as exc:
            if _status(exc) == 404:
                return False
        time.sleep(0.1)
    logger.warning(
        "container %s was still being removed after %.0fs", container_id, wait_s
    )
    return False


def _remove_one(api: Any, container_id: str) -> bool:
    try:
        return remove_container(api, container_id)
    except Exception as exc:
        logger.warning("could not remove container %s: %s", container_id, exc)
        return False


def _remove(api: Any, container_ids: list[str]) -> int:
    """Remove containers (a few at a time: a SIGTERM's grace period is short) and count the removed."""
    if len(container_ids) <= 1:
        return sum(_remove_one(api, cid) for cid in container_ids)
    with ThreadPoolExecutor(max_workers=min(8, len(container_ids))) as pool:
        return sum(pool.map(lambda cid: _remove_one(api, cid), container_ids))


def _listed(api: Any, labels: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.containers(
        all=True, filters={"label": [f"{LABEL_ROLE}={ROLE}", *labels]}
    )
    return found


def reap_dead_owners(api: Any) -> int:
    """Remove the containers of every owner on this host that died; returns how many were removed."""
    dead = [
        c["Id"]
        for c in _listed(api, [LABEL_PID])
        if not owner_alive(c.get("Labels") or {})
    ]
    if dead:
        logger.info("removing %d containers of dead runs on this host", len(dead))
    return _remove(api, dead)


def remove_owned(api: Any, run_id: str) -> int:
    """Remove every container this process started for ``run_id``."""
    mine = owner_labels(run_id)
    return _remove(
        api,
        [
            c["Id"]
            for c in _listed(
                api,
                [f"{k}={mine[k]}" for k in (LABEL_RUN, LABEL_PID, LABEL_HOST)],
            )
        ],
    )


def remove_run(api: Any, run_id: str) -> int:
    """Remove every container of ``run_id``, whichever process started it (the driver's final sweep)."""
    return _remove(api, [c["Id"] for c in _listed(api, [f"{LABEL_RUN}={run_id}"])])


def count_run(api: Any, run_id: str) -> int:
    """How many containers of ``run_id`` exist, running or not."""
    return len(_listed(api, [f"{LABEL_RUN}={run_id}"]))


class ShutdownHooks:
    """Cleanups that run once at interpreter exit and on SIGTERM/SIGHUP, whichever comes first.

    A signal handler can only be installed from the main thread; elsewhere (a Ray actor's thread) only
    ``atexit`` is installed and a killed process is swept by the next runtime's start-up reaper.
    """

    _SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._cleanups: dict[int, Callable[[], None]] = {}
        self._installed = False
        self._guard = threading.Lock()

    def register(self, key: int, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` at exit or on a terminating signal unless :meth:`unregister` comes first."""
        with self._guard:
            self._cleanups[key] = cleanup
            if not self._installed:
                self._installed = True
                atexit.register(self.run_all)
                if threading.current_thread() is threading.main_thread():
                    for signum in self._SIGNALS:
                        self._chain(signum)

    def unregister(self, key: int) -> None:
        """Forget ``key``'s cleanup (its owner shut down cleanly)."""
        self._cleanups.pop(key, None)

    def run_all(self) -> None:
        """Run and forget every registered cleanup; takes no lock, so a signal handler may call it."""
        while self._cleanups:
            _, cleanup = self._cleanups.popitem()
            try:
                cleanup()
            except Exception as exc:
                logger.warning("workspace cleanup failed: %s", exc)

    def _chain(self, signum: int) -> None:
        previous = signal.getsignal(signum)

        def handler(received: int, frame: FrameType | None) -> None:
            self.run_all()
            if callable(previous):
                previous(received, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(received, signal.SIG_DFL)
                os.kill(os.getpid(), received)

        signal.signal(signum, handler)


#: The process's one set of hooks: every runtime in it registers here.
SHUTDOWN_HOOKS = ShutdownHooks()
