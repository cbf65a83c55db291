"""Collectives over the data-parallel ranks for a step's numbers; with one process, the identity.

Knows Lightning's strategy, nothing about models. Each method is a collective: every rank calls it at the
same point of its step. Under DDP and FSDP2 with ``tensor_parallel_size: 1``, ranks are data-parallel replicas.
Each collective takes its tensor to the strategy's device first: NCCL has no CPU backend, so a CPU tensor (a
count kept on the host, a Python number made a tensor) would end the first step with "No backend type associated
with device type cpu"; the results stay on that device.
"""

from __future__ import annotations

import atexit
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_grpo.types import Rollout


class Ranks:
    """The data-parallel ranks of ``trainer``, for the collectives a GRPO step needs."""

    def __init__(self, trainer: L.Trainer) -> None:
        self.strategy = trainer.strategy
        self.world_size = trainer.world_size
        self.rank = trainer.global_rank
        self.device = trainer.strategy.root_device

    def gather_rows(self, t: Tensor) -> Tensor:
        """[N, ...] on each rank -> [W*N, ...] in rank order."""
        if self.world_size == 1:
            return t
        return self.strategy.all_gather(t.to(self.device)).reshape(-1, *t.shape[1:])

    def gather_padded(self, t: Tensor) -> Tensor:
        """[N, T_rank] on each rank -> [W*N, max T] in rank order, right-padded with zeros."""
        if self.world_size == 1:
            return t
        width = int(self.strategy.all_gather(torch.tensor(t.shape[1], device=self.device)).max())
        return self.gather_rows(torch.nn.functional.pad(t, (0, width - t.shape[1])))

    def own_rows(self, t: Tensor) -> Tensor:
        """This rank's [N, ...] of a [W*N, ...] tensor gathered with ``gather_rows``."""
        n = t.shape[0] // self.world_size
        return t[self.rank * n : (self.rank + 1) * n]

    def sum(self, t: Tensor) -> Tensor:
        """The sum of ``t`` over the ranks, a new float tensor (``t`` is left as it was). One all-reduce, queued:
        Lightning's ``strategy.reduce`` puts a barrier before it, which under NCCL makes the host wait for the
        device's queue to drain, at each of the step's sums."""
        if self.world_size == 1:
            return t
        total = t.to(self.device, torch.float32, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def most(self, n: int) -> int:
        """The largest of the ranks' ``n``."""
        if self.world_size == 1:
            return n
        return int(self.strategy.all_gather(torch.tensor(n, device=self.device)).max())

    def lengths(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """[W*N] completion lengths and truncation flags of every rank."""
        local = torch.stack([rollout.completion_mask.sum(1), rollout.is_truncated.long()], dim=1)  # [N, 2]
        both = self.gather_rows(local)
        return both[:, 0], both[:, 1].bool()


def every_rank(state: Any) -> list[Any]:
    """Each rank's ``state`` (any picklable object) in rank order, on every rank: what one rank writes to a
    checkpoint for all of them. A collective when the process group is up."""
    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, state)
    return every


def own_state(saved: dict[str, Any], what: str) -> dict[str, Any]:
    """This rank's entry of a checkpoint's ``{"ranks": every_rank(state)}``: ``{}`` when there is none, and with a
    warning when another number of ranks wrote it (``what`` it is, for the warning)."""
    states = saved.get("ranks", [])
    rank, size = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    if len(states) == size:
        return states[rank]
    if any(states):
        rank_zero_warn(f"the checkpoint's {what} was saved by {len(states)} ranks, this run has {size}: not restored")
    return {}


def destroy_process_group_at_exit(trainer: L.Trainer) -> None:
    """Have the default process group of a multi-process run destroyed at interpreter exit, while Python is still
    whole. Lightning does so for NCCL only; a gloo group left to the interpreter's finalisation can abort a process
    whose fit succeeded (SIGABRT, "terminate called without an active exception": gloo's worker threads still hold
    work whose tensors are freed after the interpreter is gone, pytorch/pytorch#179291). A one-process run's group
    is not Lightning's (an in-process vLLM engine makes its own and cleans it up at exit) and is left alone. Once
    per process, however often called."""
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        atexit.unregister(_destroy_process_group)
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
