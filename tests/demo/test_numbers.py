"""The real-model template (``templates/smollm2_cpu.yaml``), run as a user runs it for a few steps: Hugging Face's
SmolLM2-135M-Instruct from its GGUF file, its own chat template, the largest-number task. The whole run's rise of
held-out accuracy (seeds 0-2, minutes on 2 cores) is measured by running the template itself; the figures are in
``references/benchmarks.md``."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from helpers import ROOT, console_script, smollm2_missing

from lightning_grpo.demo.numbers import HELD_OUT, largest_rows


def test_the_task_asks_in_words_and_holds_out_triples_never_trained_on():
    rows = largest_rows()
    triples = [[int(n) for n in re.findall(r"\d+", row["prompt"][0]["content"])] for row in rows]
    assert all(len(set(t)) == 3 and all(10 <= n <= 99 for n in t) for t in triples)
    assert all(row["answer"] == str(max(t)) for row, t in zip(rows, triples))
    held_out, train = ({frozenset(t) for t in part} for part in (triples[:HELD_OUT], triples[HELD_OUT:]))
    assert len(held_out) == HELD_OUT and not held_out & train  # a triple, in any order, is held out or trained on


@pytest.mark.slow  # ~90 s: the model converted from its GGUF (once per LIGHTNING_GRPO_HOME), 2 steps, 2 validations
@pytest.mark.skipif(smollm2_missing() is not None, reason=str(smollm2_missing()))
def test_the_template_starts_where_its_comment_says_and_takes_steps(tmp_path):
    command = [console_script(), "fit", "--config", str(ROOT / "templates" / "smollm2_cpu.yaml")]
    command += ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--data.max_val_prompts", "16"]
    command += ["--trainer.default_root_dir", "runs/here"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = tmp_path.glob("runs/here/lightning_logs/*/summary.json")
    summary = json.loads(summary.read_text())
    assert summary["steps"] == 2, summary
    assert summary["accuracy_before"] <= 0.2, summary  # it reasons aloud and runs out of tokens: little to read
