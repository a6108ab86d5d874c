"""The one config schema: typed sections, YAML loading with includes and overrides, validation at load.

``load_config(path, overrides)`` returns a validated :class:`PipelineConfig`; every rule between fields is
checked there, before any actor starts.
"""

from roll_async.config.schema import ConfigError, PipelineConfig, load_config

__all__ = ["ConfigError", "PipelineConfig", "load_config"]
