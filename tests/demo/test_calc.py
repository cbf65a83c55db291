"""The embedded tool demo, run as a user runs it: with the calculator tool, held-out accuracy rises by 40+ points
within 5 minutes; the same model and task without the tool stays near where it started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, console_script

from lightning_grpo.demo.calc import CALL_PIECES, build_calc_tokenizer, episode_texts, mul_rows
from lightning_grpo.engines import HermesParser, ToolCall

CONFIG = str(ROOT / "templates" / "tools_cpu.yaml")
NO_TOOL = ["--model.rollout_engine", "null", "--trainer.default_root_dir", "runs/tools_cpu_no_tool"]


def test_a_call_is_seven_tokens_and_parses_back(tmp_path):
    from transformers import AutoTokenizer

    build_calc_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)  # as the demo loads it
    row = {"prompt": [{"role": "user", "content": "37*6="}], "answer": "222"}
    plain, prompt, call, reply = episode_texts(tokenizer, row)
    assert "mul" in prompt and "mul" not in plain and reply == "<|tool|>222<eos><|assistant|>"
    ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    assert len(ids) == 7 and tokenizer.convert_ids_to_tokens(ids)[0] == CALL_PIECES[0]  # 3 pieces, 3 digits, EOS
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert HermesParser().parse(text) == ("", [ToolCall("mul", {"a": 37, "b": 6})])


def test_validation_products_are_held_out():
    rows = mul_rows()
    assert len(rows) == 90 * 8 and len({r["prompt"][0]["content"] for r in rows}) == 720
    assert all(r["answer"] == str(eval(r["prompt"][0]["content"].rstrip("="))) for r in rows[:5])


def fit(cwd: Path, *args: str) -> dict:
    exe = console_script()
    proc = subprocess.run([exe, "fit", "--config", CONFIG, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = cwd.glob(f"{'runs/tools_cpu_no_tool' if args else 'runs/tools_cpu'}/lightning_logs/*/summary.json")
    return json.loads(summary.read_text())


def test_the_warm_start_s_chunked_backward_is_the_padded_batch_s_gradient():
    """``next_token_backward`` sorts rows of unequal length into chunks; its gradients are those of the mean loss
    one padded batch gives (Hugging Face's own ``labels=`` loss), to float rounding."""
    import random

    import torch

    from lightning_grpo.demo.calc import next_token_backward
    from lightning_grpo.demo.tiny import build_tiny_qwen2

    torch.manual_seed(0)
    tokenizer = build_calc_tokenizer()
    model, rng = build_tiny_qwen2(tokenizer), random.Random(0)
    rows = [([rng.randrange(3, 60) for _ in range(n)], [-100] * (n // 2) + [5] * (n - n // 2)) for n in range(3, 40, 5)]
    width, pad = max(len(ids) for ids, _ in rows), tokenizer.pad_token_id
    padded = {
        "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows]),
    }
    model(**padded).loss.backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    next_token_backward(model, pad, rows, chunks=3)
    for p, want in zip(model.parameters(), reference, strict=True):
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_the_tool_is_learnt_and_the_control_without_it_stays(tmp_path):
    with_tool = fit(tmp_path)
    assert with_tool["accuracy_after"] - with_tool["accuracy_before"] >= 0.40, with_tool
    assert with_tool["wall_time_s"] < 300, with_tool
    (run,) = tmp_path.glob("runs/tools_cpu/lightning_logs/*")
    episodes = [json.loads(line)["completion"] for line in (run / "samples.jsonl").read_text().splitlines()]
    assert any("tool mul: " in e for e in episodes)  # the sample logger shows the calls and the replies
    assert not (run / "alerts.jsonl").exists(), (run / "alerts.jsonl").read_text()

    without = fit(tmp_path, *NO_TOOL)
    assert without["accuracy_before"] == pytest.approx(with_tool["accuracy_before"], abs=0.05)  # the same start
    assert abs(without["accuracy_after"] - without["accuracy_before"]) <= 0.10, without
