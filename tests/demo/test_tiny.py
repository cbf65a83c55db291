"""The README's main job, run as a user runs it: held-out accuracy must rise by 40+ points within 5 minutes and land
at 80%+ on every seed of five with 1 or 2 threads, and a SIGTERM half-way followed by a resume must end exactly where
the uninterrupted run ends."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, console_script

from lightning_grpo.cli import main

CONFIG = str(ROOT / "templates" / "tiny_cpu.yaml")


def lightning_grpo(*args: str) -> list[str]:
    exe = console_script()
    return [exe, "fit", "--config", CONFIG, *args]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("default")
    proc = subprocess.run(lightning_grpo(), cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GRPO run: 200 steps" in proc.stdout
    return next(cwd.glob("runs/tiny_cpu/lightning_logs/version_*"))


@pytest.mark.slow
def test_default_run_learns_the_task(default_run):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.40, summary
    assert summary["wall_time_s"] < 300, summary
    # A healthy run: the default-on collapse and KL alerts stay quiet (they write alerts.jsonl when they fire)
    assert not (default_run / "alerts.jsonl").exists(), (default_run / "alerts.jsonl").read_text()
    assert (default_run / "samples.jsonl").exists() and (default_run / "hf_model" / "config.json").exists()


@pytest.mark.slow
def test_sigterm_then_resume_ends_like_the_uninterrupted_run(default_run, tmp_path):
    # Output to a file, not a pipe: nobody reads a pipe while the run goes on, and a full one would stall it
    log = tmp_path / "first.log"
    with log.open("w") as out:
        run = subprocess.Popen(lightning_grpo(), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, text=True)
        first = tmp_path / "runs/tiny_cpu/lightning_logs/version_0"
        deadline = time.time() + 600
        while not list(first.glob("checkpoints/epoch=*-step=100.ckpt")):  # the first validation's checkpoint
            assert run.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)  # between the two validations (steps 100 and 200)
        run.wait(timeout=300)
    err = log.read_text()
    assert run.returncode == 128 + signal.SIGTERM, err[-3000:]
    last = first / "checkpoints" / "last.ckpt"
    assert last.exists(), err[-3000:]

    resumed = subprocess.run(
        lightning_grpo("--ckpt_path", str(last)), cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = json.loads((default_run / "summary.json").read_text())
    assert not (first.parent / "version_1").exists()  # the resumed run continues its own run directory
    got = json.loads((first / "summary.json").read_text())
    for key in ("steps", "accuracy_before", "accuracy_after", "reward_before", "reward_after"):
        assert got[key] == pytest.approx(expected[key], abs=1e-6), key


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
# 2 threads beside another xdist worker on 2 cores thrash (CI: 827 s for 5 seeds; 212 s alone): run alone
@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.alone)])
def test_every_seed_lands(threads, tmp_path, restore_threads):
    """The template as shipped, 5 seeds: each ends at 80%+ held-out. Threads change the sums' rounding, so the sampled
    tokens and the run: with a warm start that answered any digit, the same settings ended at 31% (the "always 9"
    plateau), 72.5% or 89% by seed and thread count. In-process, ~20 s a seed."""
    landed = {}
    for seed in range(5):
        root = tmp_path / str(seed)
        main(["fit", "--config", CONFIG, "--seed_everything", str(seed), "--threads.num_threads", str(threads),
              "--trainer.default_root_dir", str(root)])  # fmt: skip
        summary = json.loads(next(root.glob("lightning_logs/version_*/summary.json")).read_text())
        landed[seed] = summary["accuracy_after"]
        print(f"threads {threads} seed {seed}: held-out {summary['accuracy_after']:.1%}, {summary['wall_time_s']} s")
    assert min(landed.values()) >= 0.80, landed


def test_the_first_build_of_an_embedded_model_says_what_it_builds_and_where(tmp_path, monkeypatch, caplog):
    """Issue 59: the first build of a demo model printed nothing for minutes."""
    import logging

    from lightning_grpo.demo.registry import materialize

    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(tmp_path))
    with caplog.at_level(logging.INFO):
        first = materialize("lightning-grpo/tiny-max")
        materialize("lightning-grpo/tiny-max")
    said = [r.getMessage() for r in caplog.records if "Building the embedded" in r.getMessage()]
    assert len(said) == 1 and str(first) in said[0] and "LIGHTNING_GRPO_HOME" in said[0], said
