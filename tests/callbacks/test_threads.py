"""Each local process gets its share of the cores; OMP_NUM_THREADS and an explicit setting win. A CPU run's freed
memory is kept for the next step."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.callbacks import threads
from lightning_grpo.callbacks.threads import TorchThreads, threads_per_process

CPU_TRAINER = SimpleNamespace(num_devices=2, strategy=SimpleNamespace(root_device=torch.device("cpu")))


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cores_are_shared_between_local_processes():
    assert threads_per_process(2, cores=2, env={}) == 1  # the 231 s -> 10.8 s case of two DDP processes
    assert threads_per_process(4, cores=2, env={}) == 1
    assert threads_per_process(1, cores=8, env={}) == 8
    assert threads_per_process(2, cores=8, env={"OMP_NUM_THREADS": "3"}) == 3
    assert threads_per_process(2, cores=8, env={"OMP_NUM_THREADS": "junk"}) == 4


def test_callback_sets_the_share_when_fitting_starts(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    torch.set_num_threads(4)
    TorchThreads().setup(CPU_TRAINER, None, "fit")
    assert torch.get_num_threads() == 2
    TorchThreads(num_threads=3).setup(CPU_TRAINER, None, "fit")
    assert torch.get_num_threads() == 3


def test_one_line_says_the_threads_why_and_what_fits_a_busy_machine(monkeypatch, restore_threads, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(threads, "load_average", lambda: 0.2)
    with caplog.at_level("INFO"):
        TorchThreads().setup(CPU_TRAINER, None, "fit")
    assert [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()] == [
        "torch threads: 2 per process (4 cores / 2 processes on this machine); "
        "set threads.num_threads (or OMP_NUM_THREADS) on a busy machine."
    ]
    caplog.clear()
    # another job keeps 3 of the 4 cores busy: 2 processes x 2 threads want 4, one is free -> 1 thread each
    monkeypatch.setattr(threads, "load_average", lambda: 3.1)
    with caplog.at_level("INFO"):
        TorchThreads().setup(CPU_TRAINER, None, "fit")
    (line,) = [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]
    assert "load average 3.1 on 4 cores leaves ~1 free" in line and line.endswith(
        "set threads.num_threads: 1 (or OMP_NUM_THREADS=1)."
    )
    caplog.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with caplog.at_level("INFO"):
        TorchThreads().setup(CPU_TRAINER, None, "fit")
    assert "torch threads: 1 per process (OMP_NUM_THREADS=1)" in caplog.text


def test_bad_thread_count_is_named():
    with pytest.raises(ValueError, match="num_threads must be >= 1 or None, got 0"):
        TorchThreads(num_threads=0)


# One round as a SmolLM2 step allocates and frees its gradients (or decode's packed weights): a 113 MB embedding's,
# then 30 layers' of 1 and 3 MB, 20 rounds. Prints the page faults of the last 10: glibc's default hands the
# layers' freed blocks back to the kernel and faults them in again, kept memory is reused.
ROUNDS = """
import resource, sys, torch
from lightning_grpo.callbacks.threads import reuse_freed_memory
print(reuse_freed_memory() if sys.argv[1] == "reuse" else "default")
for i in range(20):
    if i == 10:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones(113 * 250_000)] + [torch.ones(mb * 250_000) for _ in range(30) for mb in (1, 1, 1, 1, 3, 3, 3)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    def faults(mode: str) -> tuple[str, int]:
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}  # no MALLOC_* of the caller's
        out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, env=env, check=True)
        said, count = out.stdout.split()
        return said, int(count)

    said, reused = faults("reuse")
    # glibc's default here: ~879,000 faults in most runs, 0-134,000 in some (the heap's layout varies); kept memory:
    # ~240 in every run
    assert said == "True" and reused < 5_000, (reused, faults("default"))


def test_the_environments_malloc_settings_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert threads.reuse_freed_memory() is False
