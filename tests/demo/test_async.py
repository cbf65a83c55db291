"""templates/async_cpu.yaml as a user runs it, against what references/scale.md and concepts.md say of it (issue 59
item 6): from the current warm start it learns 38% -> 100% held-out in its 200 steps, as the synchronous template
does; one update stale its token ratios are not 1 (with ``top_p: 0.9`` too: staleness, not the filter), and the
gap stays under MismatchAlert's limits, so the shipped template fires no alert."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, console_script

ASYNC = str(ROOT / "templates" / "async_cpu.yaml")


def fit(cwd: Path, *args: str) -> Path:
    command = [console_script(), "fit", "--config", ASYNC, "--trainer.default_root_dir", "runs/here", *args]
    command += ["--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false"]
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next((cwd / "runs/here/lightning_logs").glob("version_*"))


def sampling_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in rows if "train/sampling/kl" in r]


def spread(rows: list[dict]) -> tuple[float, float]:
    """The lowest 5th and the highest 95th percentile of the token ratios over the steps."""
    return min(r["train/sampling/token_ratio/p5"] for r in rows), max(r["train/sampling/token_ratio/p95"] for r in rows)


def mismatch_alerts(run: Path) -> list[str]:
    alerts = run / "alerts.jsonl"
    lines = alerts.read_text().splitlines() if alerts.exists() else []
    return [line for line in lines if "mismatch" in line.lower()]


@pytest.mark.slow  # ~70 s of training: two processes
def test_the_async_template_learns_as_documented_and_fires_no_false_mismatch(tmp_path):
    run = fit(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert 0.30 <= summary["accuracy_before"] <= 0.45 and summary["accuracy_after"] >= 0.95, summary
    rows = sampling_rows(run)[2:]  # the first batches are sampled by the weights that score them
    assert spread(rows)[0] < 1 < spread(rows)[1], spread(rows)
    # MismatchAlert judges the median of its window against max_kl 0.01; the largest step stays within twice that
    # (0.0118 measured on 2 busy cores, where the producer is more often the whole update stale)
    kl = sorted(r["train/sampling/kl"] for r in rows)
    assert kl[len(kl) // 2] < 0.01 and kl[-1] < 0.02 and not mismatch_alerts(run), kl
    assert "38.0% -> 100.0%" in (ROOT / "references" / "scale.md").read_text()


@pytest.mark.slow
def test_with_top_p_its_ratios_are_not_1_and_no_mismatch_fires(tmp_path):
    run = fit(tmp_path, "--model.sampling.top_p", "0.9", "--trainer.max_steps", "12")
    rows = sampling_rows(run)[2:]
    print("top_p 0.9: token ratios p5-p95", spread(rows), "kl max", max(r["train/sampling/kl"] for r in rows))
    assert spread(rows)[0] < 1 < spread(rows)[1], spread(rows)
    assert not mismatch_alerts(run)
    assert "Its token ratios are not 1" in (ROOT / "references" / "concepts.md").read_text()
