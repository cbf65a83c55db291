"""Two real processes on gloo: weights stay in sync, ranks sample differently, metrics and alerts are global; on the
tiny model and on SmolLM2-135M-Instruct's first 2 layers (its tokenizer, config and tied embeddings: issue 57)."""

import json

import pytest
from helpers import run_ranks


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_model_dir", "smollm2_short_dir"])  # the tiny Qwen2; SmolLM2's 2 layers
def test_two_process_ddp_run(model, arith_jsonl, tmp_path, request):
    model_dir = request.getfixturevalue(model)
    ranks = run_ranks("ddp_run.py", [model_dir, arith_jsonl, str(tmp_path), "batch"], tmp_path)
    assert ranks[0]["param_head"] == ranks[1]["param_head"]  # gradients were all-reduced
    # the alert fired on rank 0 only, and both ranks stopped at the same step
    assert [r["alert_firings"] for r in ranks] == [1, 0]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2
    assert ranks[0]["barriers"] == ranks[1]["barriers"] == [0, 0]  # the step's sums: all-reduces, no barrier (4)
    # the package destroyed the gloo group at exit, before the interpreter's finalisation (which can abort)
    assert [json.loads((tmp_path / f"exit{r}.json").read_text()) for r in (0, 1)] == [{"group_alive": False}] * 2
    for step in range(2):
        a, b = ranks[0]["seen"][step], ranks[1]["seen"][step]
        assert a["completions"] != b["completions"]  # own prompts and own sampling seed per rank
        assert a["reward"] == b["reward"]  # reward metrics are computed over both ranks' completions
        assert a["global_tokens"] == b["global_tokens"] == a["local_tokens"] + b["local_tokens"]  # dapo
