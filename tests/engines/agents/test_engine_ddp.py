"""The agent endpoint on two real processes (gloo, DDP and FSDP2) with synced generation: ranks whose agents ask a
different number of times."""

import socket

import pytest
from helpers import run_ranks

from tests.engines.multiturn.test_tool_calling_training import chat_jsonl, tool_model_dir  # noqa: F401 (fixtures)

pytest.importorskip("openai")


@pytest.mark.slow  # ~40 s a run: two processes, two steps
@pytest.mark.parametrize(
    ("strategy", "sampler"), [("fsdp2", "HFGenerate"), ("fsdp2", "LeanDecode"), ("ddp", "LeanDecode")]
)
def test_ranks_whose_agents_ask_unequally_do_not_deadlock(tool_model_dir, chat_jsonl, tmp_path, strategy, sampler):  # noqa: F811
    port = two_free_ports()
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


def two_free_ports() -> int:
    """A port p with p + 1 also free (as far as this moment can tell)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")
