"""The open-files limit: every env-server connection is a file descriptor on both ends.

A server holding 2,000 sessions (and a client opening them) needs more than the
1,024 descriptors many systems give a process by default; past the limit,
``accept`` and ``connect`` fail with EMFILE and sessions are refused. The soft
limit can be raised up to the hard one without privileges, so the env server,
the client and the load benchmark raise it at start and say so.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: What the env server and its clients ask for (capped at the hard limit).
WANTED_OPEN_FILES = 65536


def raise_open_files_limit(want: int = WANTED_OPEN_FILES) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to ``want`` (at most the hard limit); returns (before, after).

    Never lowers it; on a platform without ``resource`` (or if refused) returns the limit unchanged.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.warning(
                "could not raise the open-files limit from %d: %s", soft, exc
            )
            return (soft, soft)
        return (soft, target)
    return (soft, soft)
