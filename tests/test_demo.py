"""The README's main job, run as a user runs it: held-out accuracy must rise by 40+ points within 5 minutes."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_default_run_learns_the_task(tmp_path):
    exe = shutil.which("lightning-grpo")
    assert exe, "the console script is installed with the package"
    proc = subprocess.run(
        [exe, "fit", "--config", str(ROOT / "templates" / "tiny_cpu.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GRPO run: 1000 steps" in proc.stdout
    run_dir = next(tmp_path.glob("runs/tiny_cpu/lightning_logs/version_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.40, summary
    assert summary["wall_time_s"] < 300, summary
    # A healthy run: the default-on collapse and KL alerts stay quiet (they write alerts.jsonl when they fire)
    assert not (run_dir / "alerts.jsonl").exists(), (run_dir / "alerts.jsonl").read_text()
    assert (run_dir / "samples.jsonl").exists() and (run_dir / "hf_model" / "config.json").exists()
