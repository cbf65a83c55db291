"""Two real processes on gloo (DDP and FSDP2) with synced generation: ranks whose episodes have different numbers of
turns."""

import pytest
from helpers import run_ranks

from tests.engines.multiturn.test_tool_calling_training import chat_jsonl, tool_model_dir  # noqa: F401 (fixtures)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_ranks_with_different_turns_do_not_deadlock(tool_model_dir, chat_jsonl, tmp_path, strategy):  # noqa: F811
    ranks = run_ranks("tools_ddp_run.py", [tool_model_dir, chat_jsonl, str(tmp_path), strategy], tmp_path)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2
    turns = [[s["turns_max"] for s in r["seen"]] for r in ranks]
    assert turns[0][0] == 4.0 and turns[1] == [1.0, 1.0]  # rank 0: 3 rounds of calls then the cut turn
    # every rank made as many generate calls as the longest episode of the step had turns: rank 1 stepped dummies
    assert ranks[0]["generate_calls"] == ranks[1]["generate_calls"] == sum(max(t) for t in zip(*turns))
    assert ranks[0]["param_head"] == ranks[1]["param_head"]  # gradients were all-reduced (FSDP2: gathered)
