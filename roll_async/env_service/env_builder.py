"""Where a tag's envs run: in the worker's threads (default), in a child process each, or on env servers.

The EnvManager's loop should be the same wherever an env runs; the choice per
``custom_envs.<Tag>`` (``isolation: process``, ``service_url``) is made here,
in one builder, and process and remote envs are both async envs. An env in the
worker's own process that asks for the policy's tokenizer (a ``use_tokenizer``
method, e.g. the swe env's token budget for observations) gets it here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from roll_async.config.schema import CustomEnvConfig
from roll_async.env_service.client import RemoteEnv
from roll_async.env_service.process_env import ProcessEnv
from roll_async.prompts.tokenizers import ChatTokenizer

EnvFactory = Callable[[str, dict[str, Any]], Any]


def env_builder(
    tag: str,
    custom_env: CustomEnvConfig,
    factory: EnvFactory,
    *,
    call_timeout_s: float,
    tokenizer: ChatTokenizer | None = None,
) -> Callable[[dict[str, Any]], Any]:
    """``env_config -> env`` for one tag, honouring ``service_url`` and ``isolation``.

    A remote tag is built by the server from ``custom_env.env_type`` (a custom
    ``factory`` cannot travel there); a process-isolated one runs ``factory`` in
    the child, so it must be picklable (the default RegisteredEnvFactory is).

    ``custom_envs.<Tag>.isolation: process`` wraps every env of the tag in a
    :class:`ProcessEnv`; ``custom_envs.<Tag>.service_url`` makes every env a
    :class:`RemoteEnv` on that server (list). Both are async envs, so the
    EnvManager's loop is the same for all three; only the builder differs. Both
    have an ``async prepare()`` (start the process / create the server's instance)
    that the EnvManager awaits after building, with a generous timeout, so that
    ``env_step_timeout_s`` measures reset and step only.

    ``tokenizer``: the policy's, handed to an in-thread env with a ``use_tokenizer(tokenizer)``
    method once it is built; a process or remote env does without (the tokenizer stays in this process).
    """
    if custom_env.service_url:
        urls = custom_env.service_url

        def remote(env_config: dict[str, Any]) -> Any:
            return RemoteEnv(
                urls,
                custom_env.env_type,
                env_config,
                call_timeout_s=call_timeout_s,
                max_retries=custom_env.service_max_retries,
            )

        return remote
    if custom_env.isolation == "process":

        def isolated(env_config: dict[str, Any]) -> Any:
            return ProcessEnv(
                functools.partial(factory, tag, env_config), name=f"{tag}-env"
            )  # started by prepare()

        return isolated

    def in_thread(env_config: dict[str, Any]) -> Any:
        env = factory(tag, env_config)
        use_tokenizer = getattr(env, "use_tokenizer", None)
        if tokenizer is not None and callable(use_tokenizer):
            use_tokenizer(tokenizer)
        return env

    return in_thread
