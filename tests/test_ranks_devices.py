"""Every collective of a step hands its backend a tensor on the module's device. NCCL has a backend for CUDA only:
a host tensor in an ``all_reduce`` ends the first step ("No backend type associated with device type cpu"), which
gloo on CPU never shows. With a GPU, the process group is ``cuda:gloo`` (CUDA only, as NCCL; two ranks may share
the one GPU); without one, ``cpu:gloo`` runs the same two ranks and steps, so the script and its features are
checked on every machine, the device rule where a GPU is."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import MULTIPROCESS, free_port, rank_report

from tests.distill.test_targets import teacher_dir  # noqa: F401  (the fixture)


def run_two_nodes(args: list[str], out_dir) -> list[dict]:
    """Rank k as node k of one device each, started here (not by Lightning's launcher)."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
        env |= {"NODE_RANK": str(rank), "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(MULTIPROCESS / "collectives_device_run.py"), *args]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    return [rank_report(out_dir, rank) for rank in (0, 1)]


@pytest.mark.slow
def test_adaptive_entropy_and_gkd_steps_under_a_one_device_backend(tiny_model_dir, teacher_dir, arith_jsonl, tmp_path):  # noqa: F811
    backend, accelerator = ("cuda:gloo", "gpu") if torch.cuda.is_available() else ("cpu:gloo", "cpu")
    args = [tiny_model_dir, teacher_dir, arith_jsonl, str(tmp_path), backend, accelerator]
    ranks = run_two_nodes(args, tmp_path)
    for report in ranks:
        assert len(report["steps"]) == 2
        assert all(0 <= step["agreement"] <= 1 for step in report["steps"])  # gkd's counts summed over ranks
    assert ranks[0]["steps"] == ranks[1]["steps"]  # the coefficient and the agreement are global: one value
