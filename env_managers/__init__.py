"""EnvManagers (one env instance's rollout loop each) and the Ray worker that hosts them."""

from roll_async.env_managers.env_manager import EnvManager, EnvManagerSettings
from roll_async.env_managers.worker import (
    EnvManagerHost,
    EnvManagerWorker,
    build_env_managers,
)
from roll_async.errors import EngineRequestError

__all__ = [
    "EngineRequestError",
    "EnvManager",
    "EnvManagerHost",
    "EnvManagerSettings",
    "EnvManagerWorker",
    "build_env_managers",
]
