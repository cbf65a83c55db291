"""The agent endpoint on two real processes (gloo, DDP and FSDP2) with synced generation: ranks whose agents ask a
different number of times; and with a vLLM server as the sampler, a rank whose agents never ask."""

import os

import pytest
import requests
from helpers import free_port, run_ranks

from tests.engines.multiturn.test_tool_calling_training import chat_jsonl, tool_model_dir  # noqa: F401 (fixtures)
from tests.engines.vllm.test_servers_sticky import StandIn

pytest.importorskip("openai")


@pytest.mark.slow  # ~40 s a run: two processes, two steps
@pytest.mark.parametrize(
    ("strategy", "sampler"), [("fsdp2", "HFGenerate"), ("fsdp2", "LeanDecode"), ("ddp", "LeanDecode")]
)
def test_ranks_whose_agents_ask_unequally_do_not_deadlock(tool_model_dir, chat_jsonl, tmp_path, strategy, sampler):  # noqa: F811
    port = free_port(span=2)
    args = [tool_model_dir, chat_jsonl, str(tmp_path), strategy, sampler, str(port)]
    ranks = run_ranks("agents_ddp_run.py", args, tmp_path)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2
    assert [r["port"] for r in ranks] == [port, port + 1]  # a fixed port: each rank its own, port + local rank
    assert ranks[0]["requests"] == [3.0, 3.0] and ranks[1]["requests"] == [1.0, 1.0]  # requests per episode
    # every rank called its sampler as often (rank 0: at least 3 calls a step); rank 1, whose 4 episodes a step ask
    # once (8 rows in all), stepped one-token dummies while rank 0's agents asked on
    calls = [r["budgets"] for r in ranks]
    assert len(calls[0]) == len(calls[1]) >= 6, calls
    assert sum(len(b) for b in calls[1] if b != [1]) == 8 and calls[1].count([1]) >= 1, calls
    assert ranks[0]["param_head"] == ranks[1]["param_head"]  # gradients were all-reduced (FSDP2: gathered)


@pytest.mark.slow  # ~60 s: a stand-in vLLM server and a 2-process run of two steps
def test_a_rank_whose_agents_never_ask_keeps_step_with_the_server_s_weight_sync(tool_model_dir, chat_jsonl, tmp_path):  # noqa: F811
    """Under DDP each rank's sampler is its own client of the server, and the weight sync is a collective of all
    ranks: the first one must happen where every rank is, not at a rank's first request (rank 1's agents send
    none), or the ranks' collectives cross (rank 0's sync meets rank 1's gather of rewards)."""
    server = StandIn(tool_model_dir).wait()
    try:
        args = [tool_model_dir, chat_jsonl, str(tmp_path), server.url]
        ranks = run_ranks("agents_server_ddp_run.py", args, tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
        served = requests.get(f"{server.url}/stats", timeout=10).json()
    finally:
        server.kill()
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2
    assert ranks[0]["requests"] == [1.0, 1.0] and ranks[1]["requests"] == [0.0, 0.0]  # requests per episode
    assert ranks[0]["param_head"] == ranks[1]["param_head"]  # the gradients were all-reduced
    assert served["weight_updates"] == 3  # at the start (before any request) and after each step
