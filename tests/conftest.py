"""Shared fixtures: one tiny model, one Ray instance and one real vLLM engine per test session.

Starting vLLM costs ~25 s on CPU, so every integration test shares ``engine``;
tests that need their own engine (shutdown, bad options) start one explicitly.

``tests/unit/<folder>/`` mirrors ``roll_async/<folder>/`` (``trainer/parallel`` included), so a
module's tests sit at its path; ``tests/unit/`` itself holds the tests of roll_async's top-level
modules (``cli.py``, ``api_reference.py``, ``sampling.py``, the public API in ``__init__.py``) and
``local_actor.py``, the helper the engine and runtime tests share (a stand-in for a Ray handle, not
a fake a user would reuse, so not in ``roll_async.testing``). ``tests/unit/benchmarks/`` mirrors
``benchmarks/``; ``tests/unit/project/`` checks the repository rather than a module (README,
packaging, pins, import layers). The folders have no ``__init__.py`` (pytest's default ``prepend``
import mode), so every test file's name stays unique across ``tests/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from roll_async.model.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole session (2 logical CPUs, no dashboard)."""
    import ray

    from roll_async.runtime.ray_utils import init_ray

    init_ray(num_cpus=4)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def engine_config():
    from roll_async.config.schema import EngineConfig

    return EngineConfig(
        dtype="float32", max_model_len=1024, max_num_seqs=64, cpu_kv_cache_space_gib=1.0
    )


@pytest.fixture(scope="session")
async def engine(ray_session, tiny_model_path, engine_config):
    """The session's real engine: a Ray actor owning vLLM AsyncLLM on the tiny model."""
    from roll_async.engine.engine_actor import launch_engines, shutdown_engines

    (actor,) = await launch_engines(
        str(tiny_model_path), engine_config, name_prefix="test_engine"
    )
    yield actor
    await shutdown_engines([actor])


def pytest_collection_modifyitems(config, items):
    """Every integration test is also ``slow``: ``-m "not slow"`` is the fast tier of unit tests."""
    for item in items:
        if item.get_closest_marker("integration") is not None:
            item.add_marker(pytest.mark.slow)
