"""Both rollout schedulers keep RolloutScheduling: every member, with a compatible signature.

``typing.runtime_checkable`` only checks that the names exist; this compares each method's parameters
(names, kinds, defaults, types), whether it is a coroutine, and its return type, and checks that a fresh
instance of each class has the protocol's attributes.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.scheduler.interface import RolloutScheduling
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.scheduler.rollout_scheduler import RolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory

SCHEDULERS = [LocalRolloutScheduler, RolloutScheduler]

PROTOCOL_METHODS = {
    name: member
    for name, member in vars(RolloutScheduling).items()
    if inspect.isfunction(member) and not name.startswith("_")
}
PROTOCOL_ATTRIBUTES = {
    name: hint
    for name, hint in typing.get_type_hints(RolloutScheduling).items()
    if name not in PROTOCOL_METHODS
}


def returns(fn: Callable[..., Any]) -> Any:
    """What a call returns: ``Awaitable[R]`` for a coroutine function declared ``-> R`` ("unannotated": no ``->``)."""
    hint = typing.get_type_hints(fn).get("return", "unannotated")
    if inspect.iscoroutinefunction(fn):
        return Awaitable[None if hint is type(None) else hint]
    return hint


def signature_problems(cls: type, name: str, declared: Callable[..., Any]) -> list[str]:
    """How ``cls.<name>`` fails to accept every call ``declared`` allows, or to return what it promises."""
    where = f"{cls.__name__}.{name}"
    implemented = getattr(cls, name, None)
    if not callable(implemented):
        return [f"{where} is missing"]
    problems = []
    wanted = list(inspect.signature(declared).parameters.values())
    given = list(inspect.signature(implemented).parameters.values())
    wanted_types = typing.get_type_hints(declared)
    given_types = typing.get_type_hints(implemented)
    for want, have in zip(wanted, given):
        if (want.name, want.kind, want.default) != (have.name, have.kind, have.default):
            problems.append(f"{where}: parameter {have} where the protocol has {want}")
        elif wanted_types.get(want.name) != given_types.get(have.name):
            problems.append(
                f"{where}: {have.name} is {given_types.get(have.name)}, "
                f"the protocol's is {wanted_types.get(want.name)}"
            )
    if len(given) < len(wanted):
        problems.append(f"{where}: lacks {[p.name for p in wanted[len(given) :]]}")
    for extra in given[len(wanted) :]:
        if extra.default is inspect.Parameter.empty and extra.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            problems.append(
                f"{where}: {extra.name} is required but the protocol never passes it"
            )
    promised = typing.get_type_hints(declared)["return"]
    allowed = (
        typing.get_args(promised)
        if isinstance(promised, types.UnionType)
        else (returns(declared),)
    )
    if returns(implemented) not in allowed:
        problems.append(
            f"{where} returns {returns(implemented)}, the protocol one of {allowed}"
        )
    return problems


@pytest.mark.parametrize("cls", SCHEDULERS, ids=lambda c: c.__name__)
def test_every_protocol_method_exists_with_a_compatible_signature(cls):
    problems = [
        problem
        for name, declared in PROTOCOL_METHODS.items()
        for problem in signature_problems(cls, name, declared)
    ]
    assert problems == []


def test_the_protocol_covers_the_calls_the_pipeline_makes():
    # the pipeline's calls on a scheduler (batch source, checkpoint, step log, validation, rollout pipeline)
    # and the benchmarks' calls on either kind: a member dropped from the protocol fails here
    assert set(PROTOCOL_METHODS) == {
        "start",
        "get_batch",
        "get_batch_with_metrics",
        "run_fixed_round",
        "suspend",
        "resume",
        "seed_state",
        "shutdown",
    }
    assert set(PROTOCOL_ATTRIBUTES) == {"last_unserved", "ratings"}


def tiny_config() -> PipelineConfig:
    config = PipelineConfig(
        seed=3,
        rollout_batch_size=2,
        sequence_length=512,
        custom_envs={
            "count": CustomEnvConfig(
                env_type="scripted",
                env_config={"episode_length": 2},
                max_tokens_per_step=16,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["count"]
        ),
    )
    validate_config(config)
    return config


async def test_a_fresh_scheduler_of_each_kind_has_the_protocol_attributes():
    spec = rollout_spec(tiny_config(), "train")
    local = LocalRolloutScheduler(
        spec,
        engines=FakeEngine(lambda request: [0]),
        tokenizer=build_chatml_test_tokenizer(),
        env_factory=scripted_env_factory,
    )
    over_ray = RolloutScheduler(
        spec, engine_handles=[object()], tokenizer_path="unused"
    )
    try:
        for scheduler in (local, over_ray):
            for name, hint in PROTOCOL_ATTRIBUTES.items():
                value = getattr(scheduler, name)
                assert isinstance(value, typing.get_origin(hint) or hint), name
        assert await local.seed_state() == local.group_queue.seed_state()
    finally:
        await local.shutdown()
