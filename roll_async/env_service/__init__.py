"""Envs out of the worker's process: child-process isolation, an HTTP env server and its client.

* :mod:`.process_env`: ``ProcessEnv``, one env per child process, killed on timeout.
* :mod:`.server`: ``roll-async env-server`` (aiohttp), create/reset/step/close/batch and ``/health``.
* :mod:`.client`: ``RemoteEnv``, an async env proxy with per-call timeouts and retries.
* :mod:`.placement`: picks in-thread, process or remote per ``custom_envs.<Tag>``.

Nothing is imported here, so a worker whose envs all run in-thread does not load aiohttp.
"""
