"""Cores and local processes -> torch's intra-op thread count for each process. Knows nothing about training.

torch starts one thread per core in every process: two DDP processes on two cores then run four threads that
fight for two cores (100 steps: 231 s with torch's default, 10.8 s with one thread each). Each local process
gets ``cores // local processes`` threads instead, unless ``OMP_NUM_THREADS`` says otherwise.
"""

from __future__ import annotations

import os

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a Slurm allocation), not all of the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_process(local_processes: int, cores: int | None = None, env: dict[str, str] | None = None) -> int:
    """``OMP_NUM_THREADS`` when set, else an equal share of the cores for each of ``local_processes``.

    >>> threads_per_process(2, cores=2, env={}), threads_per_process(3, cores=16, env={})
    (1, 5)
    >>> threads_per_process(2, cores=16, env={"OMP_NUM_THREADS": "4"})
    4
    """
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        return int(env["OMP_NUM_THREADS"])
    return max(1, (cores or available_cores()) // max(1, local_processes))


class TorchThreads(L.Callback):
    """Give each local process its share of the cores (``torch.set_num_threads``) when fitting starts.

    Args:
        num_threads: threads per process; ``None`` takes ``OMP_NUM_THREADS`` when set, else the cores this
            process may use divided by the processes on this machine (``trainer.num_devices``).
    """

    def __init__(self, num_threads: int | None = None) -> None:
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.num_threads = num_threads

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        threads = self.num_threads or threads_per_process(trainer.num_devices)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
            rank_zero_info(f"torch threads: {threads} per process ({trainer.num_devices} on this machine).")
