"""benchmarks/trl_vs_lightning_grpo.py runs both sides end to end on the tiny model and its JSON report adds up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "trl_vs_lightning_grpo.py"


@pytest.mark.slow  # ~25 s, plus ~40 s to materialise the demo model into a fresh LIGHTNING_GRPO_HOME
def test_tiny_comparison_reports_both_sides(tmp_path):
    # One run per side at beta 0.1 (the reference-model path): 1 untimed + 2 timed optimiser steps each.
    # The workers inherit LIGHTNING_GRPO_HOME (conftest or CI), where the demo model gets materialised.
    report_path = tmp_path / "bench.json"
    command = [sys.executable, str(SCRIPT), "--model", "tiny", "--repeats", "1", "--steps", "2", "--warmup", "1"]
    command += ["--betas", "0.1", "--json", str(report_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    report = json.loads(report_path.read_text())
    assert report["matmul_gflops"] > 0
    (comparison,) = report["speed"]
    assert comparison["model"] == "tiny" and comparison["beta"] == 0.1
    median = comparison["median"]
    for side in ("ours", "trl"):
        (run,) = comparison["runs"][side]
        assert len(run["log"]["stamps"]) == 1 + 1 + 2  # train start, then every optimiser step
        assert median[side]["steps_per_s"] > 0
        assert median[side]["tokens_per_s"] > 0
        assert median[side]["peak_rss_mb"] > 0
    for metric in ("steps_per_s", "tokens_per_s", "peak_rss_mb"):
        assert comparison["ratios"][metric] == pytest.approx(median["ours"][metric] / median["trl"][metric])
