"""The one config schema: typed sections, YAML loading with includes and overrides, validation at load.

``load_config(path, overrides)`` returns a validated :class:`PipelineConfig`; every rule between fields is
checked there, before any actor starts.

Import them from :mod:`roll_async.config.schema`. This package imports nothing itself, so the
dataclasses load without the YAML loader's omegaconf (the trainer runs on torch, transformers and
peft alone).
"""
