"""The shell-agent env (``env_type: swe``): an agent works on a repository or a shell setup through commands, scored by hidden tests.

One folder because the pieces change together: task formats (``harbor``, ``swe_rows`` into one
``task_spec``), the shipped tasks (``task_bank``, ``task_bank_shell``, written by ``shipped``), what
the agent can do (``actions``), how it is scored (``verifier``) and the episode (``env``). The shell
itself comes from :mod:`roll_async.workspaces`.
"""
