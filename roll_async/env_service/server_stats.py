"""The env server's counters: envs made and closed, calls, and each way a call can fail.

The health endpoint reports them and tests and benchmarks read them, while
several parts of the server count into them (the HTTP handlers, the
exactly-once ledger, the env host); one record shared by all of them keeps a
single set of numbers without each part importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerStats:
    created: int = 0
    closed: int = 0
    calls: int = 0
    env_errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    bad_requests: int = 0
    reaped_idle: int = 0
    overloaded: int = 0
    #: calls answered from the last call's record instead of being applied again
    repeats: int = 0
    out_of_sequence: int = 0
