"""pytest plugin the SWE verifier copies into the workspace: each test's outcome, tagged with the episode's nonce.

An exit code alone can be faked by code the tests import (``os._exit(0)`` at import time), so the
verifier reads the outcomes this plugin prints at the end of the session, each line carrying a
nonce that the plugin read from a file and deleted before any test module was imported.
Lines: ``ROLL_ASYNC_RESULT <nonce> <passed|failed|skipped|error> <nodeid>`` and, last,
``ROLL_ASYNC_EXIT <nonce> <exit status>``.
"""

from __future__ import annotations

import os
from typing import Any


def _read_nonce() -> str:
    path = os.environ.pop("ROLL_ASYNC_NONCE_FILE", "")
    if not path:
        return ""
    try:
        with open(path, encoding="ascii") as handle:
            nonce = handle.read().strip()
        os.unlink(path)
    except OSError:
        return ""
    return nonce


_NONCE = _read_nonce()
_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report: Any) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid] = "failed"
    elif report.nodeid not in _OUTCOMES and (report.when == "call" or report.skipped):
        _OUTCOMES[report.nodeid] = str(report.outcome)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid or "<collection>"] = "error"


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    lines = [f"ROLL_ASYNC_RESULT {_NONCE} {o} {n}" for n, o in _OUTCOMES.items()]
    lines.append(f"ROLL_ASYNC_EXIT {_NONCE} {int(exitstatus)}")
    os.write(1, ("\n" + "\n".join(lines) + "\n").encode("utf-8", "replace"))
