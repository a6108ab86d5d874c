"""Weight transport to the engine replicas: packed once, in buckets, through the object store once.

Sending the trainer's state dict to every replica would pickle it once per
replica; instead the driver packs it into safetensors buckets, ``ray.put``s each
bucket once and hands every replica the same refs, so replicas on one node read
the same shared-memory objects and each object and message stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Ray and safetensors are imported inside the functions: importing this module stays cheap.

#: Default bucket size: large enough that per-bucket overhead is negligible, small enough to bound peak memory.
DEFAULT_BUCKET_BYTES = 256 << 20


def pack_weight_buckets(
    weights: Mapping[str, Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[bytes]:
    """The state dict as safetensors blobs of at most ``bucket_bytes`` each (in name order).

    A tensor larger than ``bucket_bytes`` is a bucket of its own. A replica fetches the
    buckets and loads them in one reload (``VLLMEngine.update_weights``; a reload per
    partial bucket corrupts the model), so buckets bound the size of each object and
    message, not the replica's peak memory.
    """
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
