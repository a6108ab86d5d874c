"""Pick the trainer a config asks for: a user's class by dotted path, the simulated one, or the built-in GRPO trainer.

The pipeline and the trainer actor build trainers only through here, so the
choice and the check that a custom class really has the Trainer methods live in
one place.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.config.sections import TrainerConfig
from roll_async.errors import ConfigError, RollAsyncError
from roll_async.trainer.base import TRAINER_METHODS, Trainer
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trainer.model_loading import empty_causal_lm, load_causal_lm
from roll_async.trainer.simulated import SimulatedTrainer

#: The functions that read a model's files for the trainer: an error raised inside one is the model's.
_MODEL_LOADERS = frozenset({load_causal_lm.__code__, empty_causal_lm.__code__})


class ModelLoadError(RollAsyncError, RuntimeError):
    """The trainer could not read ``model_path`` as a causal LM (its config or weights); ``cause`` says why.

    Raised only for errors that come out of the model-loading functions, so that any
    other failure while building a trainer (Ray, ranks, optimizer) surfaces as itself.
    Its arguments are plain strings: it crosses Ray from a trainer actor or rank.
    """

    def __init__(self, model_path: str, cause: str) -> None:
        super().__init__(model_path, cause)
        self.model_path, self.cause = model_path, cause

    def __str__(self) -> str:
        return f"cannot load {self.model_path!r} as a causal LM: {self.cause}"


def raised_loading_the_model(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a model-loading function (its traceback passes through one)."""
    return any(
        frame.f_code in _MODEL_LOADERS
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


@contextmanager
def loading_the_model(model_path: str) -> Iterator[None]:
    """Around building a trainer: an error from reading the model becomes :class:`ModelLoadError`; others pass."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        if raised_loading_the_model(exc):
            raise ModelLoadError(model_path, f"{type(exc).__name__}: {exc}") from exc
        raise


def load_trainer_class(dotted_path: str) -> type:
    """Import ``package.module:ClassName`` and check it has the Trainer methods; ConfigError otherwise."""
    key = "trainer.trainer_cls"
    module_name, sep, attr = dotted_path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{key}={dotted_path!r} is not a dotted path; write it as package.module:ClassName "
            "(or leave it empty for the built-in GRPO trainer)"
        )
    try:
        obj = resolve_dotted(dotted_path, f"{key}={dotted_path!r}")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}; check the name and that the package is installed or on PYTHONPATH"
        ) from exc
    if not isinstance(obj, type):
        raise ConfigError(
            f"{key}={dotted_path!r} names a {type(obj).__name__}, not a class"
        )
    missing = [m for m in TRAINER_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise ConfigError(
            f"{key}={dotted_path!r}: class {obj.__name__} lacks the Trainer method(s) {', '.join(missing)}; "
            "see roll_async.trainer.base.Trainer"
        )
    return obj


def build_trainer(config: TrainerConfig, model_path: str) -> Trainer:
    """The configured trainer: the simulated one, ``config.trainer_cls`` if set, else the built-in GRPO trainer."""
    if config.simulate_step_s > 0:
        return SimulatedTrainer(config, model_path)
    return build_model_trainer(config, model_path)


def build_model_trainer(config: TrainerConfig, model_path: str) -> Trainer:
    """A trainer holding a model: ``config.trainer_cls`` if set, else the built-in GRPO trainer."""
    if config.trainer_cls:
        cls = load_trainer_class(config.trainer_cls)
        # its methods were checked on loading
        trainer: Trainer = cls(config, model_path)
        return trainer
    with loading_the_model(model_path):
        return GRPOTrainer(config, model_path)
