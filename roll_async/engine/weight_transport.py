"""Weight transport to the engine replicas: packed once, in buckets, through the object store once.

Sending the trainer's state dict to every replica would pickle it once per
replica; instead the driver packs it into safetensors buckets, ``ray.put``s each
bucket once and hands every replica the same refs, so replicas on one node read
the same shared-memory objects and each object and message stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from roll_async.runtime.tensor_groups import bytes_bounded_groups

# Ray and safetensors are imported inside the functions: importing this module stays cheap.

#: Default bucket size: large enough that per-bucket overhead is negligible, small enough to bound peak memory.
DEFAULT_BUCKET_BYTES = 256 << 20


def iter_weight_buckets(
    named_tensors: Iterable[tuple[str, Any]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[bytes]:
    """Safetensors blobs of at most ``bucket_bytes`` each, packed as the weights arrive."""
    from safetensors.torch import save

    for group in bytes_bounded_groups(named_tensors, bucket_bytes):
        yield save({k: t.detach().to("cpu").contiguous() for k, t in group.items()})


def pack_weight_buckets(
    weights: Mapping[str, Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[bytes]:
    """The state dict as safetensors blobs of at most ``bucket_bytes`` each (in name order).

    A tensor larger than ``bucket_bytes`` is a bucket of its own. A replica fetches the
    buckets and loads them in one reload (``VLLMEngine.update_weights``; a reload per
    partial bucket corrupts the model), so buckets bound the size of each object and
    message, not the replica's peak memory.
    """
    return list(iter_weight_buckets(weights.items(), bucket_bytes))


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
        fetched: bytes = await bucket
        return fetched
    given: bytes = bucket
    return given
