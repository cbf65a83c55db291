"""Cores and local processes -> torch's intra-op thread count for each process, and the C allocator's reuse of
freed memory on a CPU run. Knows nothing about training.

torch starts one thread per core in every process: two DDP processes on two cores then run four threads that
fight for two cores (100 steps: 231 s with torch's default, 10.8 s with one thread each). Each local process
gets ``cores // local processes`` threads instead, unless ``OMP_NUM_THREADS`` says otherwise.
"""

from __future__ import annotations

import ctypes
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
    return env_threads(env) or max(1, (cores or available_cores()) // max(1, local_processes))


def env_threads(env: dict[str, str] | None = None) -> int | None:
    """``OMP_NUM_THREADS`` when it is a positive integer, else None."""
    value = (os.environ if env is None else env).get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable processes, ours included), None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def thread_line(threads: int, why: str, processes: int, cores: int, load: float | None) -> str:
    """The one start-up line: the threads chosen and why, and on a busy machine the setting that fits.

    The machine is busy when the load average leaves fewer free cores than ``processes x threads``: threads then
    wait for each other, and the run is many times slower than with fewer threads.

    >>> print(thread_line(2, "2 cores / 1 process", processes=1, cores=2, load=0.3))  # doctest: +NORMALIZE_WHITESPACE
    torch threads: 2 per process (2 cores / 1 process); set threads.num_threads (or OMP_NUM_THREADS) on a busy
    machine.
    >>> print(thread_line(2, "2 cores / 1 process", processes=1, cores=2, load=1.9))  # doctest: +NORMALIZE_WHITESPACE
    torch threads: 2 per process (2 cores / 1 process); busy machine: 1-minute load average 1.9 on 2 cores leaves
    ~0 free, and threads that outnumber the free cores run many times slower (2 processes x 2 threads on 2 cores);
    set threads.num_threads: 1 (or OMP_NUM_THREADS=1).
    """
    line = f"torch threads: {threads} per process ({why})"
    free = cores - round(load) if load is not None else cores
    if processes * threads <= max(1, free):
        return line + "; set threads.num_threads (or OMP_NUM_THREADS) on a busy machine."
    fit = max(1, free // processes)
    return (
        f"{line}; busy machine: 1-minute load average {load:.1f} on {cores} cores leaves ~{max(0, free)} free, and "
        "threads that outnumber the free cores run many times slower (2 processes x 2 threads on 2 cores); "
        f"set threads.num_threads: {fit} (or OMP_NUM_THREADS={fit})."
    )


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30  # mallopt takes a C int: 2 GiB and over wrap


def reuse_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MiB for reuse instead of handing them back to the kernel;
    whether it could (False off glibc, e.g. macOS or musl, where nothing changes).

    Why: a CPU step frees and allocates the same large blocks every step (the gradients, the decode's packed weights,
    activations). glibc's default maps each block over its adaptive threshold fresh from the kernel and unmaps it on
    free, so every step page-faults its memory in again: SmolLM2-135M at 2 prompts x 8 x 16 tokens on 2 cores, warm
    steps 3-6 of ``benchmarks/profile_step.py`` (the command in its docstring), took 283,000-296,000 page faults,
    1.4-2.2 s of kernel time and 5.1-6.1 s a step with glibc's default; with these settings 55,000-69,000 faults
    (the 113 MB embedding gradient and packed LM head, over the 32 MiB cap, are still mapped fresh), 0.1-0.4 s and
    4.1-4.4 s. Setting the trim threshold alone is worse (``MALLOC_TRIM_THRESHOLD_=4294967296`` in the environment:
    1.2M faults, ~5 s a step, one earlier run): it turns off the adaptive threshold, so every large block is mapped.
    The environment's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, when set, are left alone.
    """
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    if os.name != "posix":
        return False
    libc = ctypes.CDLL(None)  # the C library this process runs on (ctypes.util.find_library would start a process)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class TorchThreads(L.Callback):
    """Give each local process its share of the cores (``torch.set_num_threads``), and say so in one line; on a
    CPU run, have the C allocator keep freed memory for the next step (``reuse_freed_memory``).

    The line, when fitting starts, says how many threads, why, and on a busy machine (a high load average) which
    setting fits.

    Args:
        num_threads: threads per process; ``None`` takes ``OMP_NUM_THREADS`` when set, else the cores this
            process may use divided by the processes on this machine (``trainer.num_devices``).

    Example::

        trainer = L.Trainer(callbacks=[TorchThreads(num_threads=1)])
    """

    def __init__(self, num_threads: int | None = None) -> None:
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.num_threads = num_threads

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        processes, cores = trainer.num_devices, available_cores()
        threads = self.num_threads or threads_per_process(processes, cores)
        torch.set_num_threads(threads)
        rank_zero_info(thread_line(threads, self.why(processes, cores), processes, cores, load_average()))
        if trainer.strategy.root_device.type == "cpu":
            reuse_freed_memory()

    def why(self, processes: int, cores: int) -> str:
        if self.num_threads:
            return "threads.num_threads"
        if from_env := env_threads():
            return f"OMP_NUM_THREADS={from_env}"
        return f"{cores} cores / {processes} process{'es' if processes > 1 else ''} on this machine"
