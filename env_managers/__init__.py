"""EnvManagers (one env instance's rollout loop each) and the Ray worker that hosts them."""

from env_managers.env_manager import EngineRequestError, EnvManager, EnvManagerSettings
from env_managers.worker import EnvManagerHost, EnvManagerWorker, build_env_managers

__all__ = [
    "EngineRequestError",
    "EnvManager",
    "EnvManagerHost",
    "EnvManagerSettings",
    "EnvManagerWorker",
    "build_env_managers",
]
