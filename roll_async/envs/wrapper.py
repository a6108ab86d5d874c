"""EnvWrapper: the base of envs that add behaviour around another env instance.

Wrappers are gymnasium-style: they are handed the env they wrap and never build
it themselves, so they do not depend on the registry. A wrapper registered by
name has a ``config_cls`` with ``inner_env_type`` and ``inner_env_config``
fields; :func:`roll_async.envs.registry.make_env` builds that inner env and
passes it in.
"""

from __future__ import annotations

from typing import Any


class EnvWrapper:
    """Delegates to ``inner``: closing closes it; its solvers, action words and renders stay reachable."""

    def __init__(self, env: Any, config: Any) -> None:
        self.config = config
        self.inner = env

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
