"""vLLM server mode (``VLLMServer``) against a real server process speaking vLLM's HTTP protocol
(``tests/engines/vllm/vllm_fake_server.py``: Hugging Face ``generate`` behind the endpoints TRL 1.16's client calls),
through TRL's real ``VLLMClient``, in a real 2-process DDP run. vLLM's NCCL weight stream is a TCP stream here
(``tests/engines/vllm/vllm_stand_in``), the one part that needs CUDA."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch
from helpers import MULTIPROCESS, TESTS, free_port

from lightning_grpo.engines import VLLMServer

HERE = Path(__file__).parent
STAND_IN = HERE / "vllm_stand_in"


@pytest.fixture
def server(tiny_model_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "vllm_fake_server.py"), tiny_model_dir, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                requests.get(f"{url}/health", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # ~40 s: the server process and a 2-process DDP run of 3 steps
def test_ddp_ranks_generate_on_the_server_each_its_own_and_rank_zero_pushes_weights_every_step(
    server, tiny_model_dir, arith_jsonl, tmp_path
):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STAND_IN), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        str(MULTIPROCESS / "vllm_server_run.py"),
        tiny_model_dir,
        arith_jsonl,
        str(tmp_path),
        server,
    ]
    proc = subprocess.run([*command, str(free_port())], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    stats = requests.get(f"{server}/stats", timeout=10).json()

    assert stats["models_requests"] == 3  # each rank asks what it serves, and rank 0's TRL client (NCCL) too
    probes = [{"prompts": 1, "n": 1}]  # the sync check's greedy probe, after each of the 4 pushes
    steps = [{"prompts": 2, "n": 4}] * 2  # each rank's 2 prompts, in a request of its own (nothing via rank 0)
    assert stats["generate_requests"] == probes + (steps + probes) * 3
    sampled = [o for o, r in zip(stats["sampling_options"], stats["generate_requests"]) if r["n"] == 4]
    assert sampled == [False] * 6  # sampling.generation_kwargs reach SamplingParams
    for rank in ranks:
        assert rank["global_step"] == 3
        for batch, step in zip(rank["batches"], rank["steps"]):
            assert step["rollout"].prompts == [p for p in batch for _ in range(4)]  # this rank's own share
            assert step["rollout"].completion_mask.sum() > 0
    assert set(ranks[0]["batches"][0]).isdisjoint(ranks[1]["batches"][0])

    state = ranks[0]["state"]
    # at the start (the server may hold another run's weights) and after every step
    assert stats["weight_updates"] == 4 and stats["tensors_received"] == 4 * len(state)
    requests.post(f"{server}/save", json={"path": str(tmp_path / "server.pt")}, timeout=10)
    served = torch.load(tmp_path / "server.pt", weights_only=True)
    for name, tensor in state.items():
        torch.testing.assert_close(served[name], tensor, rtol=0, atol=0, msg=name)  # the trained weights
    # The server sampled from the policy's current weights at every step: its log-probs are the policy's, so the
    # importance ratio of the sampling correction stays 1 (stale weights after step 1 would move it)
    for rank in ranks:
        for step in rank["steps"]:
            ratio = {k: v for k, v in step["metrics"].items() if k.startswith("sampling/importance_sampling_ratio")}
            assert ratio and all(v == pytest.approx(1.0, abs=1e-3) for v in ratio.values()), ratio


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"base_url": "localhost:8000"}, "base_url must be an http"),
        ({"connection_timeout": -1}, "connection_timeout must be >= 0"),
        ({"weight_transfer": "gloo"}, r"weight_transfer must be one of \['disk', 'nccl'\], got 'gloo'"),
        ({"sync_check_every": -1}, "sync_check_every must be >= 0"),
        ({"lora_sync": "merge"}, r"VLLMServer lora_sync must be one of \['adapter', 'merged'\], got 'merge'"),
    ],
)
def test_bad_settings_are_refused_when_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VLLMServer(**kwargs)


def test_refused_where_it_cannot_push_weights():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine can push weights")
    with pytest.raises(ValueError, match="VLLMServer cannot run on this machine: .*no CUDA GPU"):
        VLLMServer(weight_transfer="nccl")
    assert VLLMServer().weight_transfer == "disk"  # the server reads a safetensors file the trainer writes


TEARDOWN = """
import sys
from pathlib import Path

import lightning as L

from lightning_grpo.engines import VLLMServer
from lightning_grpo.model.policy import Policy

server, model_dir, named = sys.argv[1:]
policy, trainer = Policy(model_dir), L.Trainer(accelerator="cpu", logger=False)
engine = VLLMServer(base_url=server, weight_transfer="disk", sync_check_every=0)
engine.setup(policy, trainer, 0)
folder = Path(engine.weights_dir)
(folder / "model.safetensors").write_bytes(b"a pushed model")  # what a push writes there
engine.teardown()
assert not folder.exists() and engine.weights_dir is None, folder
engine.setup(policy, trainer, 0)  # a second fit makes a new one
assert Path(engine.weights_dir).is_dir()
engine.teardown()
mine = VLLMServer(base_url=server, weight_transfer="disk", weights_dir=named)
mine.setup(policy, trainer, 0)
mine.teardown()
assert Path(named).is_dir()
"""


def test_the_temporary_weights_folder_is_removed_at_teardown(server, tiny_model_dir, tmp_path):
    """weight_transfer disk without weights_dir: the folder the model is written to for the server is this run's
    own and goes with it (before: a whole copy of the model left in /tmp after every run); a named one stays. In a
    process of its own: TRL's client needs an importable vLLM (the stand-in)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STAND_IN), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", TEARDOWN, server, tiny_model_dir, str(tmp_path / "mine")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
