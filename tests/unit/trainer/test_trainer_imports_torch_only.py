"""The trainer imports with torch, transformers and peft alone: what a bare GPU node has.

``python -m benchmarks.gpu_trainer`` is carried to such a node as a working tree with no
virtual environment, so the trainer code it uses (GRPOTrainer, LoRA, FSDP2 sharding, packed
micro-batches) and the config dataclasses it builds must not import the YAML loader
(omegaconf), the env renderers (PIL), Ray, vLLM or the HTTP stack at module level.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from benchmarks.common import REPO

#: Top-level packages a GPU node with torch, transformers and peft does not have.
ABSENT = (
    "omegaconf",
    "PIL",
    "ray",
    "vllm",
    "aiohttp",
    "zmq",
    "fastapi",
    "uvicorn",
    "openai",
)

PROBE = textwrap.dedent(
    """
    import importlib.abc
    import sys

    ABSENT = {absent!r}

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ABSENT:
                raise ModuleNotFoundError(f"No module named {{name!r}} (absent on a bare GPU node)")
            return None

    sys.meta_path.insert(0, Absent())
    import benchmarks.gpu_trainer
    import roll_async.config.sections
    import roll_async.trainer.grpo_trainer
    import roll_async.trainer.lora
    import roll_async.trainer.micro_batches
    import roll_async.trainer.parallel.sharding
    print("imported")
    """
)


def test_the_gpu_benchmark_and_the_trainer_import_without_omegaconf_pil_ray_or_vllm():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(absent=ABSENT)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-3000:]
