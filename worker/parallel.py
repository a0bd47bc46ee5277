"""Tensor-parallel group state and the collectives the parallel layers need.

With ``size == 1`` no process group exists and every collective is the identity; otherwise
the default ``torch.distributed`` group, which the worker process initialised, is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TPGroup:
    """This process's place in its tensor-parallel group."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp rank {self.rank} is outside a group of {self.size}")
        if self.size > 1 and not dist.is_initialized():
            raise RuntimeError("tensor parallelism needs torch.distributed initialised (init_tensor_parallel)")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the group, in place."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0 gets every rank's ``x`` concatenated along the last dimension (rank order);
        other ranks get None. All ranks' ``x`` have the same shape."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1) if parts is not None else None


def default_backend() -> str:
    """nccl where CUDA is available, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_tensor_parallel(
    rank: int, size: int, init_method: str | None = None, backend: str | None = None, store: dist.Store | None = None
) -> TPGroup:
    """Join the default process group of ``size`` ranks, through ``init_method`` (e.g.
    ``tcp://127.0.0.1:PORT``) or a rendezvous ``store``, and return this rank's group.
    ``size == 1`` creates no process group."""
    if size > 1:
        dist.init_process_group(
            backend or default_backend(), init_method=init_method, store=store, rank=rank, world_size=size
        )
    return TPGroup(rank, size)


def split_evenly(total: int, size: int, what: str) -> int:
    """``total / size``, or a ValueError naming ``what`` when it does not divide."""
    if total % size:
        raise ValueError(f"{what} ({total}) is not divisible by tp size {size}")
    return total // size
