"""Each local process gets its share of the cores; OMP_NUM_THREADS and an explicit setting win."""

from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.callbacks import threads
from lightning_grpo.callbacks.threads import TorchThreads, threads_per_process


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
    TorchThreads().setup(SimpleNamespace(num_devices=2), None, "fit")
    assert torch.get_num_threads() == 2
    TorchThreads(num_threads=3).setup(SimpleNamespace(num_devices=2), None, "fit")
    assert torch.get_num_threads() == 3


def test_one_line_says_the_threads_why_and_what_fits_a_busy_machine(monkeypatch, restore_threads, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(threads, "load_average", lambda: 0.2)
    with caplog.at_level("INFO"):
        TorchThreads().setup(SimpleNamespace(num_devices=2), None, "fit")
    assert [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()] == [
        "torch threads: 2 per process (4 cores / 2 processes on this machine); "
        "set threads.num_threads (or OMP_NUM_THREADS) on a busy machine."
    ]
    caplog.clear()
    # another job keeps 3 of the 4 cores busy: 2 processes x 2 threads want 4, one is free -> 1 thread each
    monkeypatch.setattr(threads, "load_average", lambda: 3.1)
    with caplog.at_level("INFO"):
        TorchThreads().setup(SimpleNamespace(num_devices=2), None, "fit")
    (line,) = [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]
    assert "load average 3.1 on 4 cores leaves ~1 free" in line and line.endswith(
        "set threads.num_threads: 1 (or OMP_NUM_THREADS=1)."
    )
    caplog.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with caplog.at_level("INFO"):
        TorchThreads().setup(SimpleNamespace(num_devices=2), None, "fit")
    assert "torch threads: 1 per process (OMP_NUM_THREADS=1)" in caplog.text


def test_bad_thread_count_is_named():
    with pytest.raises(ValueError, match="num_threads must be >= 1 or None, got 0"):
        TorchThreads(num_threads=0)
