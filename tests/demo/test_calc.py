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
