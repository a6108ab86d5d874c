"""The driver ships the model directory through the object store only to a replica whose node lacks model.path.

Ray actors built from VLLMEngine whose ``start`` only reports what it received (no vLLM is
started; one of them pretends its node lacks the path, since on one machine every raylet
shares the filesystem). What a replica does with the files is tested in
tests/unit/runtime/test_node_files.py (``VLLMEngine.use_model_dir_on_node``).
"""

from __future__ import annotations

import hashlib

import pytest

from roll_async.engine.vllm_engine import VLLMEngine

pytestmark = pytest.mark.integration


async def test_only_the_replica_whose_node_lacks_the_model_dir_gets_its_files(
    ray_session, tiny_model_path
):
    import ray

    from roll_async.engine.engine_actor import _start_replicas
    from roll_async.runtime.node_files import model_files

    # Defined here so that Ray pickles them by value (a test module is not importable on Ray's workers).
    class ReportingEngine(VLLMEngine):
        """VLLMEngine's placement check, with a ``start`` that reports the files it was given instead of loading."""

        async def start(self, model_files=None):
            if model_files is None:
                return {"shipped": None}
            return {
                "shipped": {
                    name: hashlib.sha256(data).hexdigest()
                    for name, data in model_files.items()
                }
            }

    class NodeWithoutModelDirEngine(ReportingEngine):
        def model_dir_on_node(self) -> bool:
            return False

    path = str(tiny_model_path)
    actors = [
        ray.remote(ReportingEngine).remote(path),
        ray.remote(NodeWithoutModelDirEngine).remote(path),
    ]
    try:
        has_dir, lacks_dir = await _start_replicas(actors, path)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    assert has_dir["shipped"] is None
    expected = {
        name: hashlib.sha256(data).hexdigest()
        for name, data in model_files(path).items()
    }
    assert lacks_dir["shipped"] == expected and any(
        name.endswith(".safetensors") for name in expected
    )
