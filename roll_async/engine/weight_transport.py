"""Weight transport to the engine replicas: packed once, in buckets, through the object store once.

Before, the pipeline passed the trainer's state dict to every replica's
``update_weights`` call: Ray pickled the full dict once per replica, and each
replica packed it to safetensors bytes itself. Now the driver packs the state
dict into safetensors buckets of at most ``bucket_bytes`` (a tensor larger than
that is a bucket of its own), ``ray.put``s each bucket ONCE, and hands every
replica the same list of object refs. A replica fetches the buckets and loads
them in one reload (``VLLMEngine.update_weights``; vLLM's reload per partial
bucket was measured to corrupt the model, so buckets bound the size of each
object and message, not the replica's peak memory), and replicas on the same
node read the same shared-memory objects.
``benchmarks/weight_sync.py`` measures the time against the parameter count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Default bucket size: large enough that per-bucket overhead is negligible, small enough to bound peak memory.
DEFAULT_BUCKET_BYTES = 256 << 20


def pack_weight_buckets(
    weights: Mapping[str, Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[bytes]:
    """The state dict as safetensors blobs of at most ``bucket_bytes`` each (in name order)."""
    from safetensors.torch import save

    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be > 0")
    buckets: list[bytes] = []
    current: dict[str, Any] = {}
    size = 0
    for name, tensor in weights.items():
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(save(current))
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    if current:
        buckets.append(save(current))
    return buckets


def put_buckets(buckets: Iterable[bytes]) -> list[Any]:
    """``ray.put`` every bucket once; the refs go to every replica."""
    import ray

    return [ray.put(bucket) for bucket in buckets]


async def resolve_bucket(bucket: Any) -> bytes:
    """A bucket given to a replica: bytes, or an object ref to fetch (awaited, not blocking the actor's loop)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - Ray is a dependency
        return bytes(bucket)
    if isinstance(bucket, ray.ObjectRef):
        return await bucket
    return bucket
