"""Envs out of the worker's process: child-process isolation, an HTTP env server and its client.

* :mod:`.process_env`: ``ProcessEnv``, one env per child process, killed on timeout.
* :mod:`.server`: ``roll-async env-server`` (aiohttp), create/reset/step/close/batch and ``/health``.
* :mod:`.client`: ``RemoteEnv``, an async env proxy with per-call timeouts and retries.
* :mod:`.placement`: picks in-thread, process or remote per ``custom_envs.<Tag>``.
"""

from roll_async.env_service.client import EnvServiceClient, RemoteEnv
from roll_async.env_service.process_env import EnvProcessError, ProcessEnv
from roll_async.env_service.protocol import EnvServiceError, EnvServiceUnavailable

__all__ = ["EnvProcessError", "EnvServiceClient", "EnvServiceError", "EnvServiceUnavailable", "ProcessEnv", "RemoteEnv"]
