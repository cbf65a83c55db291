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


def test_bad_thread_count_is_named():
    with pytest.raises(ValueError, match="num_threads must be >= 1 or None, got 0"):
        TorchThreads(num_threads=0)
