"""Where per-step metrics go: metrics.jsonl always, plus TensorBoard and W&B when enabled.

Optional backends are imported only when enabled, and a missing package fails
at start with the config key and the install command, not after the first step.
"""

from __future__ import annotations

import os
from typing import Any

from roll_async.config.schema import LoggingConfig
from roll_async.errors import ConfigError
from roll_async.run_output.run_dir import RunDirectory


class MetricsTracker:
    def __init__(
        self,
        logging_config: LoggingConfig,
        run_dir: RunDirectory,
        run_config: dict[str, Any],
    ) -> None:
        self.run_dir = run_dir
        self._tensorboard = None
        self._wandb = None
        if logging_config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "logging.tensorboard=true needs the tensorboard package: pip install tensorboard "
                    "(or set logging.tensorboard=false)"
                ) from None
            self._tensorboard = SummaryWriter(log_dir=str(run_dir.root / "tensorboard"))
        if logging_config.wandb:
            try:
                import wandb
            except ImportError:
                raise ConfigError(
                    "logging.wandb=true needs the wandb package: pip install wandb (or set logging.wandb=false)"
                ) from None
            os.environ.setdefault(
                "WANDB_MODE", "offline"
            )  # offline unless the user chose otherwise
            self._wandb = wandb.init(
                project=logging_config.wandb_project,
                dir=str(run_dir.root),
                config=run_config,
                reinit=True,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run_dir.append_metrics(step, metrics)
        if self._tensorboard is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
