"""benchmarks/trl_vs_lightning_grpo.py runs both sides end to end on the tiny model and its JSON report adds up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "trl_vs_lightning_grpo.py"


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


@pytest.mark.slow  # ~20 s: two runs of 1 + 2 steps of ours
def test_ab_ours_runs_both_trees_and_prints_their_ratio(tmp_path):
    """``ab_ours.py`` with this tree as its own base: both sides run, each from the tree it names."""
    command = [sys.executable, str(SCRIPT.with_name("ab_ours.py")), "--base", str(ROOT), "--model", "tiny"]
    command += ["--repeats", "1", "--steps", "2", "--warmup", "1", "--betas", "0"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"base   ({ROOT}): median" in proc.stdout and "change / base: x" in proc.stdout, proc.stdout


MEMORY_SCRIPT = SCRIPT.with_name("memory.py")


@pytest.mark.slow  # ~60 s: 6 runs of the tiny architecture (3 of them 2-process), one optimiser step each
def test_memory_quick_reports_every_run_and_ratios_of_its_figures(tmp_path):
    report_path = tmp_path / "memory.json"
    command = [sys.executable, str(MEMORY_SCRIPT), "--quick", "--json", str(report_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    report = json.loads(report_path.read_text())
    assert report["idle"]["error"] is None and report["idle"]["ranks"][0]["ru_maxrss_mb"] > 0
    assert set(report["runs"]) == {"single", "ddp", "fsdp2", "meta", "lora"}
    for name, run in report["runs"].items():
        assert run["error"] is None, (name, run["error"])
        assert [r["rank"] for r in run["ranks"]] == ([0, 1] if name in ("ddp", "fsdp2", "meta") else [0])
        for rank in run["ranks"]:
            assert rank["world_size"] == len(run["ranks"]) and rank["steps"] == 1
            assert rank["ru_maxrss_mb"] > 0 and rank["rss_at_train_start_mb"] > 0
        assert run["figures"]["peak_rss_mb"] > 0
    single, lora = report["runs"]["single"]["ranks"][0], report["runs"]["lora"]["ranks"][0]
    assert single["reference_copy"] and not lora["reference_copy"]  # LoRA's reference is the adapter-off policy
    assert 0 < lora["trainable"] < single["trainable"] == single["params"]
    for name, ratio in report["ratios"].items():
        numerator, denominator = (report["runs"][run]["figures"] for run in ratio["of"])
        for figure in ("peak_rss_mb", "above_idle_mb", "expected_mb"):
            assert ratio[figure] == pytest.approx(numerator[figure] / denominator[figure]), (name, figure)
    assert report["ratios"]["FSDP2 / DDP"]["expected_mb"] == pytest.approx(0.5)  # each rank holds half
    assert report["ratios"]["FSDP2 meta / FSDP2"]["expected_mb"] == pytest.approx(1.0)  # the same state, loaded apart


@pytest.mark.slow  # ~30 s: three generations per path on the gen model (4 layers x 256, vocabulary 32,000)
def test_decode_step_reports_every_path_against_its_floors(tmp_path):
    report_path = tmp_path / "decode.json"
    command = [sys.executable, str(SCRIPT), "--decode-step", "--repeats", "1", "--threads", "1"]
    proc = subprocess.run([*command, "--json", str(report_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    result = json.loads(report_path.read_text())["decode_step"]
    assert result["threads"] == 1 and result["rows"] == 16
    assert result["floor_ms"] > 0 and result["compute_floor_ms"] > 0
    # every path measured; their order is the benchmark's finding, not asserted here (a timing on a shared
    # machine can swap two close figures: products 16.6 ms against the fused step's 13.3 ms in one CI run)
    paths = ("products_ms", "lean_fused", "lean_decode", "hf_generate")
    assert all(0 < result[path] < 60_000 for path in paths), {path: result[path] for path in paths}
    assert "the step's matrix products alone" in proc.stdout


@pytest.mark.slow  # ~15 s: one process per side importing its libraries
def test_imports_report_each_sides_stages_from_its_own_peak(tmp_path):
    report_path = tmp_path / "imports.json"
    command = [sys.executable, str(SCRIPT), "--imports", "--json", str(report_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    sides = {result["side"]: result for result in json.loads(report_path.read_text())["imports"]}
    assert set(sides) == {"ours", "trl"}
    for result in sides.values():
        peaks = [stage["peak_rss_mb"] for stage in result["stages"]]
        assert result["stages"][0]["module"] == "torch" and peaks == sorted(peaks)
        # the worker's own high-water mark: not the parent's RSS (which ran a 1024 x 1024 matmul benchmark
        # after importing torch) carried across exec, as ru_maxrss would be
        assert peaks[0] < 300
    assert "torchmetrics" in sides["ours"]["loaded"] and "torchmetrics" not in sides["trl"]["loaded"]


@pytest.mark.slow  # ~15 s: two 32-token calls per loop on the gen model
def test_lean_drop_runs_both_loops_with_the_same_tokens():
    # the script asserts that both loops sampled the same tokens; P(EOS) 0.1 a step ends rows well before 32
    script = SCRIPT.with_name("bench_lean_drop.py")
    command = [sys.executable, str(script), "--repeats", "1", "--max-tokens", "32", "--eos-prob", "0.1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "keep every row:" in proc.stdout and "drop ended rows:" in proc.stdout and "speed-up:" in proc.stdout


@pytest.mark.slow  # ~30 s: 6 layouts of one forward + backward on the gen model
def test_bench_padding_layouts_agree_on_synthetic_lengths():
    """Every log-prob layout gives the padded pass's log-probs (the figure the GPU run reports for CUDA), and the
    GPU script that runs it parses."""
    script = SCRIPT.with_name("bench_padding.py")
    command = [sys.executable, str(script), "--lengths", "8-40", "--prompts", "2", "--group", "4", "--repeats", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("padded", "shared", "micro", "padd"))]
    assert len(rows) == 6 and not any("FAILED" in row for row in rows), proc.stdout
    assert all(float(row[-1]) < 1e-4 for row in rows), proc.stdout  # max |log-prob - padded log-prob|
    assert subprocess.run(["bash", "-n", str(SCRIPT.with_name("gpu_checks.sh"))]).returncode == 0


@pytest.mark.slow  # ~20 s: 3 steps of the tiny shape, the last 2 profiled
def test_profile_step_lists_ops_and_host_syncs():
    script = SCRIPT.with_name("profile_step.py")
    command = [sys.executable, str(script), "--model", "tiny", "--warmup", "1", "--steps", "2", "--rows", "5"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "aten::mm" in proc.stdout and "host waits for the device over 2 steps: {'aten::item'" in proc.stdout


@pytest.mark.slow  # ~20 s: two stage workers (1 and 2 threads) on the tiny shape
def test_async_stages_time_each_stage_at_both_thread_counts(tmp_path):
    report_path = tmp_path / "stages.json"
    script = SCRIPT.with_name("bench_async.py")
    command = [sys.executable, str(script), "--stages", "--model", "tiny", "--json", str(report_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    stages = json.loads(report_path.read_text())["stages"]
    assert set(stages) == {"1", "2"}  # JSON keys: the thread counts
    for seconds in stages.values():
        assert set(seconds) == {"generation", "no-grad log-prob pass", "forward + backward + AdamW"}
        assert all(s > 0 for s in seconds.values())
    assert "stage (tiny shape, one step)" in proc.stdout


def test_the_benchmarks_last_number_reward_scores_as_numeric_match_reward():
    """The TRL worker's copy (no lightning import) gives the package reward's scores on the SmolLM2 task's replies,
    as plain text and as TRL's chat messages."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assets import last_number_reward

    from lightning_grpo.rewards import numeric_match_reward

    replies = ["The largest is 82.", "82 is bigger than 47, so 15", "Comparing 47, 82 and 15: 1,082", "none", "-5"]
    answers = ["82", "82", "1082", "82", "-5"]
    expected = numeric_match_reward(replies, answers)
    assert expected == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert last_number_reward(replies, answers) == expected
    chat = [[{"role": "assistant", "content": r}] for r in replies]
    assert last_number_reward(chat, answers) == expected
