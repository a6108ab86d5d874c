"""LoRA adapter versions on one engine replica: a directory and a vLLM LoRA request per weight version.

With ``trainer.lora.sync: adapter`` a weight sync sends the adapter alone. The replica writes it to
a directory of its own version, registers it with vLLM, and every *new* request uses the newest
version's ``LoRARequest`` (``lora_int_id = version + 1``), while a request already running keeps the
adapter it started with: its tokens all belong to that version, which is what its per-token versions
say. A version is removed (vLLM ``remove_lora`` and its directory) once it is not among the newest
``max_loras`` and no request in flight uses it. The base weights never change, so no KV cache is reset:
vLLM keys cached blocks by adapter, and a frozen request's KV stays that of its own adapter.

Measured: vLLM 0.32's CPU build serves LoRA (``PunicaWrapperCPU``) and the GPU build is the same path.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Adapter ranks vLLM accepts as ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraServing:
    """What an engine replica needs to serve a run's adapters (built by the pipeline from ``trainer.lora``)."""

    #: The adapter's rank (trainer.lora.rank).
    rank: int
    #: Adapters vLLM keeps loaded and may batch together: max_staleness + 1 (async) or 2 (sync).
    max_loras: int
    #: The ``adapter_config.json`` written next to each version's weights (peft's, from the trainer's config).
    adapter_config: dict[str, Any] = field(default_factory=dict)

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM engine arguments that turn LoRA serving on."""
        return {
            "enable_lora": True,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_loras,
            "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= self.rank),
        }


def serving_max_loras(staleness_bound: int) -> int:
    """Adapter versions a replica keeps loaded: every version a request in flight may have started on, + 1.

    ``staleness_bound`` is the resolved one (PipelineConfig.staleness_bound: 0 in sync mode); at least 2, so
    the version being pushed and the one it replaces are both loaded.
    """
    return max(2, staleness_bound + 1)


class AdapterVersions:
    """The adapter versions one replica serves: their directories, LoRA requests and requests in flight."""

    def __init__(self, serving: LoraServing) -> None:
        self.serving = serving
        self.root = Path(tempfile.mkdtemp(prefix="roll_async_lora_"))
        #: version -> its vLLM LoRARequest, oldest first
        self._requests: dict[int, Any] = {}
        #: version -> requests in flight on it
        self._in_flight: dict[int, int] = {}
        self.newest: int | None = None

    def write(self, version: int, tensors: dict[str, Any]) -> Any:
        """Write the adapter of ``version`` to its directory; returns its LoRARequest (newest from now on)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        directory = self.root / f"v{version}"
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        save_file(
            {name: t.contiguous() for name, t in tensors.items()},
            str(directory / "adapter_model.safetensors"),
        )
        (directory / "adapter_config.json").write_text(
            json.dumps(self.serving.adapter_config)
        )
        request = LoRARequest(f"roll_async_v{version}", version + 1, str(directory))
        self._requests[version] = request
        self.newest = version
        return request

    def acquire(self, lag: int = 0) -> tuple[Any, int | None]:
        """(LoRARequest, version) a new request runs on; (None, None) before the first adapter.

        ``lag`` 0: the newest adapter; ``k``: the one ``k`` loaded versions older (a policy snapshot for a
        ``snapshot:<k>`` game seat), the oldest loaded while fewer exist. The pipeline keeps ``k + 1``
        versions loaded (``LoraServing.max_loras``) so that version is there.
        """
        if self.newest is None:
            return None, None
        versions = sorted(self._requests)
        version = versions[max(0, len(versions) - 1 - max(0, int(lag)))]
        self._in_flight[version] = self._in_flight.get(version, 0) + 1
        return self._requests[version], version

    def release(self, version: int | None) -> None:
        if version is None:
            return
        self._in_flight[version] -= 1
        if not self._in_flight[version]:
            del self._in_flight[version]

    def removable(self) -> list[Any]:
        """Forget and return the LoRA requests no longer needed: older than the newest max_loras, none in flight."""
        keep = set(sorted(self._requests)[-self.serving.max_loras :])
        doomed = [
            v for v in self._requests if v not in keep and v not in self._in_flight
        ]
        removed = []
        for version in doomed:
            removed.append(self._requests.pop(version))
            shutil.rmtree(self.root / f"v{version}", ignore_errors=True)
        return removed

    def loaded_versions(self) -> list[int]:
        return sorted(self._requests)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
