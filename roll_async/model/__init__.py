"""Models the project makes itself (the offline tiny text and vision-language models, the family zoo), where a config's model path resolves to, and ``check-model``."""

from roll_async.model.paths import resolve_model_path
from roll_async.model.tiny import build_tiny_model, default_tiny_model_dir

__all__ = ["build_tiny_model", "default_tiny_model_dir", "resolve_model_path"]
