"""Model artefacts the project makes itself (the offline tiny model)."""

from roll_async.model.tiny import (
    build_tiny_model,
    default_tiny_model_dir,
    resolve_model_path,
)

__all__ = ["build_tiny_model", "default_tiny_model_dir", "resolve_model_path"]
