"""``AsyncRollouts`` over several vLLM servers (issue 44): the producer's requests spread over the servers, every
update is pushed to every server (after the batches submitted were sampled: the servers hold one version), and a
server that dies is survived (its groups generated again on the other, none scored as a failure's empty
completion), then rejoins with the current weights. The policy, the trainer, the producer process and the pushes are
real; the servers are ``vllm_fake_server.py`` processes (Hugging Face ``generate`` behind vLLM's endpoints)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import requests
import torch
from helpers import TESTS, fit, free_port, length_reward, make_module, run_ranks

from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import AsyncRollouts, VLLMServer

FAKE_SERVER = TESTS / "engines" / "vllm" / "vllm_fake_server.py"


class StandIn:
    """A ``vllm_fake_server.py`` process on a fixed free port, killed and started again by a test."""

    def __init__(self, model_dir: str) -> None:
        self.port = free_port()
        self.model_dir, self.url, self.proc = model_dir, f"http://127.0.0.1:{self.port}", None

    def start(self) -> "StandIn":
        command = [sys.executable, str(FAKE_SERVER), self.model_dir, str(self.port)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                requests.get(f"{self.url}/health", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"the stand-in server on {self.port} did not start")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stats(self) -> dict:
        return requests.get(f"{self.url}/stats", timeout=10).json()


class Outage(L.Callback):
    """Kills ``server`` after step ``kill_after``, starts it again after ``restart_after``; keeps each step's
    metrics (the rollout's and the step's extra ones) and rewards."""

    def __init__(self, server: StandIn, kill_after: int, restart_after: int) -> None:
        self.server, self.kill_after, self.restart_after = server, kill_after, restart_after
        self.metrics, self.rewards = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if not outputs:  # the pipeline filling: no update
            return
        self.metrics.append(dict(outputs["record"].stats.extra))  # the rollout's metrics and the step's
        self.rewards.append(outputs["record"].scores.total)
        if trainer.global_step == self.kill_after:
            self.server.kill()
        if trainer.global_step == self.restart_after:
            self.server.start()


@pytest.mark.slow  # ~60 s: two server processes (one restarted), a producer process, 5 real steps
def test_async_rollouts_spread_over_servers_push_to_each_and_survive_a_dead_one(tiny_model_dir, arith_jsonl, tmp_path):
    servers = [StandIn(tiny_model_dir).start() for _ in range(2)]
    try:
        engine = VLLMServer([s.url for s in servers], connection_timeout=60, request_timeout=60, max_tries=2)
        module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(engine=engine, max_staleness=1),
                             reward_funcs=[length_reward], accuracy_reward=None,
                             sampling={"max_completion_length": 6, "temperature": 0.9})  # fmt: skip
        outage = Outage(servers[1], kill_after=2, restart_after=3)
        trainer = fit(module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=5,
                      callbacks=[outage])  # fmt: skip
        served = [s.stats() for s in servers]
        requests.post(f"{servers[0].url}/save", json={"path": str(tmp_path / "server0.pt")}, timeout=10)
    finally:
        for server in servers:
            server.kill()
    assert trainer.global_step == 5 and len(outage.metrics) == 5
    assert [m["async/staleness/max"] for m in outage.metrics] == [0, 1, 1, 1, 1]  # one step behind once filled
    for m in outage.metrics[:3]:  # batches 0-2: the producer split each batch's 4 prompts over both servers
        assert m["servers/0/requests"] == m["servers/1/requests"] == 1 and m["servers/live"] == 2
        assert m["servers/0/push_mb"] > 0 and m["servers/1/push_mb"] > 0  # each update pushed to both, checked
    lost, back = outage.metrics[3:]
    # server 1 died after step 2; batch 3 (submitted at step 3, both live) lost its 2 groups there, got them from
    # server 0; the push of step 3 found it gone and took it out (nothing pushed to it)
    assert lost["servers/retried_groups"] == 2 and lost["servers/live"] == 1 and lost["servers/1/push_mb"] == 0
    # restarted after step 3: batch 4 went to server 0 alone; the push of step 4 brought server 1 back with the
    # current weights
    assert back["servers/1/requests"] == 0 and back["servers/1/push_mb"] > 0
    for rewards in outage.rewards:  # every group generated: none scored as a failure's empty completion
        assert len(rewards) == 16 and bool((rewards > 0).all()), rewards
    # server 0: the first sync and 5 updates; the restarted server 1: the catch-up and the last update
    assert [s["weight_updates"] for s in served] == [6, 2]
    assert all(m["vllm/sync_logp_error"] < 1e-3 for m in outage.metrics)  # every push checked on every server
    state = trainer.lightning_module.policy.model.state_dict()
    kept = torch.load(tmp_path / "server0.pt", weights_only=True)
    for name in kept:
        torch.testing.assert_close(kept[name], state[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow  # ~21 s each: two server processes, two trainer ranks, two producer processes, 3 real steps
@pytest.mark.parametrize("kill", [False, True], ids=["both-live", "one-killed"])
def test_async_rollouts_on_two_ddp_ranks_each_rank_s_producer_sends_its_own_requests(
    tiny_model_dir, arith_jsonl, tmp_path, kill
):
    """Under DDP each rank's producer holds its own copy of the engine and sends that rank's prompts to the servers
    (nothing gathered to rank 0), while the trainers' engines push each update to every server (a collective of both
    ranks, after each rank's producer sampled what was submitted). With the second server ended after step 1, both
    ranks' next batch lost its groups there, got them from the first, and the next push takes it out."""
    servers = [StandIn(tiny_model_dir).start() for _ in range(2)]
    try:
        args = [tiny_model_dir, arith_jsonl, str(tmp_path), ",".join(s.url for s in servers), "kill" if kill else ""]
        ranks = run_ranks("async_servers_ddp_run.py", args, tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
        served = [s.stats() for s in servers[: 1 if kill else 2]]
        for i, server in enumerate(servers[: 1 if kill else 2]):
            requests.post(f"{server.url}/save", json={"path": str(tmp_path / f"server{i}.pt")}, timeout=10)
    finally:
        for server in servers:
            server.kill()
    assert [r["global_step"] for r in ranks] == [3, 3]
    # rank 0's temporary weights folder (a whole copy of the model) went with the fit: AsyncRollouts' end ends its
    # engine's too
    assert ranks[0]["weights_dir"] is not None and not Path(ranks[0]["weights_dir"]).exists()
    steps = [r["steps"] for r in ranks]  # [rank][trained step]
    # each rank its own producer process, neither of them a trainer
    producers = {step["producer"] for rank in steps for step in rank}
    assert len(producers) == 2 and not producers & {r["pid"] for r in ranks}
    for rank in steps:
        assert [s["metrics"]["async/staleness/max"] for s in rank] == [0, 1, 1]  # k = 1 once the pipeline is full
        for s in rank:  # every group generated: none scored as a failure's empty completion
            assert len(s["rewards"]) == 8 and min(s["rewards"]) > 0, s["rewards"]
    # 4 batches submitted by each rank (3 trained, the 4th sampled before the last push); each rank's producer split
    # its 2 prompts over the live servers, one request each: the servers got both ranks' 16 prompts, one per request
    asked = [r for stats in served for r in stats["generate_requests"]]
    prompts = [r["prompts"] for r in asked if r["n"] == 4]  # not the sync checks' probes (n = 1)
    if not kill:
        assert sum(prompts) == 2 * 2 * 4 and set(prompts) == {1}
        for rank in steps:  # batches 0-2, as each rank's producer counted them
            for s in rank:
                m = s["metrics"]
                assert m["servers/0/requests"] == m["servers/1/requests"] == 1 and m["servers/live"] == 2
                assert m["servers/retried_groups"] == 0
                assert m["servers/0/push_mb"] > 0 and m["servers/1/push_mb"] > 0
        # the start and each of 3 updates, on each server, each checked
        assert [s["weight_updates"] for s in served] == [4, 4]
    else:
        # batch 2 (trained at step 3) was submitted with both servers live: each rank lost its group on server 1
        # and got it from server 0; the push after step 2 found server 1 gone and took it out
        for rank in steps:
            first, second, third = (s["metrics"] for s in rank)
            assert first["servers/retried_groups"] == second["servers/retried_groups"] == 0
            assert third["servers/retried_groups"] == 1 and third["servers/1/requests"] == 1
            assert third["servers/0/requests"] == 2 and third["servers/1/push_mb"] == 0
        assert [r["live"] for r in ranks] == [[0], [0]]
        # server 0, from each rank: one prompt of batches 0 and 1, both of batch 2 (one retried), both of batch 3
        # (in one request: server 1 was out); the start and 3 updates
        assert sorted(prompts) == [1] * 8 + [2] * 2 and served[0]["weight_updates"] == 4
    assert all(s["metrics"]["vllm/sync_logp_error"] < 1e-3 for rank in steps for s in rank)  # each push checked
    for name, tensor in ranks[0]["state"].items():  # the ranks' weights and the servers' stayed equal
        torch.testing.assert_close(ranks[1]["state"][name], tensor, rtol=0, atol=0, msg=name)
    for i in range(len(served)):
        kept = torch.load(tmp_path / f"server{i}.pt", weights_only=True)
        for name in kept:
            torch.testing.assert_close(kept[name], ranks[0]["state"][name], rtol=0, atol=0, msg=name)
