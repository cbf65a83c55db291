"""What the trainer's ranks agree through while they share servers: every rank's value, rank 0's value, and a barrier
bounded in time (a server that hangs must not hang every rank). Knows ``torch.distributed``; nothing about vLLM."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist


def bounded_barrier(timeout: float, what: str, world_size: int) -> None:
    """Every rank waits here for the others at most ``timeout`` seconds (gloo's ``monitored_barrier`` names the
    ranks that did not come; other backends wait up to their process group's timeout)."""
    if world_size == 1:
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout))
        else:
            dist.barrier()
    except RuntimeError as err:
        raise RuntimeError(f"rank {dist.get_rank()}: {what} did not finish within {timeout:g} s: {err}") from err


def all_ranks(obj: Any, world_size: int) -> list[Any]:
    """Every rank's ``obj`` on every rank (``[obj]`` without a process group)."""
    if world_size == 1:
        return [obj]
    gathered = [None] * world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def scatter_from_zero(per_rank: list[Any] | None, rank: int, world_size: int) -> Any:
    """Rank r receives ``per_rank[r]`` from rank 0."""
    if world_size == 1:
        return per_rank[0]
    received = [None]
    dist.scatter_object_list(received, per_rank if rank == 0 else None, src=0)
    return received[0]
