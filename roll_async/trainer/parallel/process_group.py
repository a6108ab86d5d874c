"""Joining the ranks into one torch.distributed group with an explicit device mesh.

The project initialises torch.distributed itself rather than relying on
launcher environment variables, so the same code runs in Ray actors and in
plain test processes: gloo for CPU ranks, NCCL for CUDA tensors with gloo kept
for CPU tensors (torch DCP and small control messages need a CPU backend).
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

#: How long a collective may wait for the other ranks before it fails (instead of hanging forever).
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class RankInfo:
    """Who this process is among the trainer's ranks."""

    rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def backend_for(device: torch.device) -> str:
    """gloo on CPU; NCCL for CUDA tensors plus gloo for CPU ones on GPU ranks."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def free_port() -> int:
    """A TCP port free on this host now (rank 0 hosts the rendezvous on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def init_rank(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device: torch.device,
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
) -> RankInfo:
    """Join the group at ``tcp://master_addr:master_port`` and build the one-dimensional mesh FSDP2 shards over.

    The mesh is passed to ``fully_shard`` explicitly: with a default group FSDP2
    may move CPU parameters to a visible GPU.
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=backend_for(device),
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    return RankInfo(rank=rank, world_size=world_size, device=device, mesh=mesh)


def leave_group() -> None:
    """Destroy the process group if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
