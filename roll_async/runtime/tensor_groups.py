"""Named tensors grouped into parts of bounded size: the one rule for engine weight buckets and HF weight shards.

Weights cross process and file boundaries in bounded pieces (an object-store
bucket, a safetensors shard); grouping them lazily lets a producer that gathers
them layer by layer hold one part at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from roll_async.errors import InvalidInputError


def bytes_bounded_groups(
    named_tensors: Iterable[tuple[str, Any]], limit: int
) -> Iterator[dict[str, Any]]:
    """Consecutive ``(name, tensor)`` pairs grouped so each group holds at most ``limit`` bytes.

    A tensor larger than ``limit`` is a group of its own. Lazy: a caller that
    feeds it weights as they are gathered holds one group at a time.
    """
    if limit <= 0:
        raise InvalidInputError(f"bucket_bytes={limit} must be > 0")
    current: dict[str, Any] = {}
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            yield current
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    if current:
        yield current
