"""MismatchAlert, driven by real runs whose sampler reports log-probs shifted from the trainer's in a controlled way
(``ShiftedSampler``: the policy's own log-probs minus ``shift`` per token, as a vLLM in another precision can)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import GRPOAlertError, MetricsFile, MismatchAlert
from lightning_grpo.cli import main
from lightning_grpo.engines import AsyncRollouts
from lightning_grpo.run import run_dir
from tests.engines.decode.test_hf import ShiftedSampler
from tests.test_docs import METRICS_TABLE, metric_patterns


class NoisySampler(ShiftedSampler):
    """The policy's log-probs plus seeded Gaussian noise of ``sigma`` per token: ratios spread, the ESS falls."""

    def __init__(self, sigma: float) -> None:
        super().__init__(0.0)
        self.sigma = sigma

    def generate(self, *args, **kw):
        rollout = super().generate(*args, **kw)
        noise = torch.randn(rollout.sampling_logps.shape, generator=torch.Generator().manual_seed(0))
        rollout.sampling_logps = rollout.sampling_logps + self.sigma * noise
        return rollout


class SpikeSampler(ShiftedSampler):
    """Agrees with the trainer except at its ``at``-th batch (1-based), ``shift`` nats a token off there: a one-step
    spike, as an update that moves the policy far makes under async."""

    def __init__(self, shift: float, at: int) -> None:
        super().__init__(0.0)
        self.spike, self.at, self.calls = shift, at, 0

    def generate(self, *args, **kw):
        self.calls += 1
        self.shift = self.spike if self.calls == self.at else 0.0
        return super().generate(*args, **kw)


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_a_run_writes_the_mismatch_metrics(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, rollout_engine=ShiftedSampler(0.3), update={"sampling_correction": "icepop"})
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2, callbacks=[MetricsFile()])
    rows = [r for r in lines(run_dir(trainer) / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 2
    e = math.exp(0.3)  # every token's trainer/sampler ratio
    for row in rows:
        assert row["train/sampling/token_mult_prob_error"] == pytest.approx(e, rel=1e-4)
        assert row["train/sampling/kl"] == pytest.approx(e - 0.3 - 1, rel=1e-3)  # k3
        assert row["train/sampling/sampling_logp_difference/mean"] == pytest.approx(0.3, rel=1e-3)
        for p in ("p5", "p50", "p95"):
            assert row[f"train/sampling/token_ratio/{p}"] == pytest.approx(e, rel=1e-4)
        assert row["train/sampling/ess/token"] == pytest.approx(1.0, abs=1e-6)  # equal ratios: no variance
        assert row["train/sampling/importance_sampling_ratio/mean"] == pytest.approx(e, rel=1e-4)  # inside [0.5, 5]
    patterns = metric_patterns(METRICS_TABLE.read_text())
    undocumented = [k for k in rows[0] if k.startswith("train/") and not any(p.fullmatch(k) for p in patterns)]
    assert not undocumented, f"add these to references/metrics.md: {undocumented}"


def test_a_shifted_sampler_stops_the_run(tiny_model_dir, arith_jsonl, tmp_path):
    alert = MismatchAlert(patience=2, action="stop")
    module = make_module(tiny_model_dir, rollout_engine=ShiftedSampler(0.3))
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=10, callbacks=[alert])
    assert trainer.global_step == 2
    assert {f.signal for f in alert.firings} == {"token_mult_prob_error", "sampler_kl"}  # the ESS stays 1
    assert "token_mult_prob_error = 1.35 > 1.1 for 2 consecutive steps" in alert.firings[0].message
    written = lines(run_dir(trainer) / "alerts.jsonl")
    assert {w["alert"] for w in written} == {"MismatchAlert"} and "same dtype" in written[0]["message"]
    last = torch.load(run_dir(trainer) / "checkpoints/last.ckpt", weights_only=False)
    restored = MismatchAlert(patience=2, action="stop")
    restored.load_state_dict(next(v for k, v in last["callbacks"].items() if k.startswith("MismatchAlert")))
    assert restored.counts == alert.counts == {"token_mult_prob_error": 2, "sampler_kl": 2}
    assert [f.message for f in restored.firings] == [f.message for f in alert.firings]


def test_a_noisy_sampler_raises_on_the_effective_sample_size(tiny_model_dir, arith_jsonl, tmp_path):
    alert = MismatchAlert(max_token_mult_prob_error=100.0, max_kl=100.0, min_ess=0.5, patience=1, action="raise")
    module = make_module(tiny_model_dir, rollout_engine=NoisySampler(1.5))
    with pytest.raises(GRPOAlertError, match=r"sampler_ess = 0\.\d+ < 0.5 for 1 consecutive steps"):
        fit(module, data(arith_jsonl), tmp_path, max_steps=3, callbacks=[alert])


def test_a_one_step_spike_is_not_a_mismatch(tiny_model_dir, arith_jsonl, tmp_path):
    windowed = MismatchAlert(patience=1, window=5)
    fit(make_module(tiny_model_dir, rollout_engine=SpikeSampler(0.3, at=3)), data(arith_jsonl), tmp_path / "w",
        max_steps=5, callbacks=[windowed])  # fmt: skip
    assert max(windowed.history["token_mult_prob_error"]) == pytest.approx(math.exp(0.3), rel=1e-4)  # measured
    assert not windowed.firings  # the median of [1, 1, 1.35, 1, 1] is 1
    one_step = MismatchAlert(patience=1, window=1)  # the judgement of one step alone fires on it
    fit(make_module(tiny_model_dir, rollout_engine=SpikeSampler(0.3, at=3)), data(arith_jsonl), tmp_path / "s",
        max_steps=5, callbacks=[one_step])  # fmt: skip
    assert [(f.step, f.signal) for f in one_step.firings] == [(3, "token_mult_prob_error"), (3, "sampler_kl")]


@pytest.mark.parametrize("correction", ["auto", "sequence_mask"])
def test_an_async_sampler_behind_by_design_gets_its_own_advice(tiny_model_dir, arith_jsonl, tmp_path, correction):
    alert = MismatchAlert(max_token_mult_prob_error=1.001, min_ess=1.0, patience=1)  # over rounding; any spread
    update = {"sampling_correction": correction}
    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1), update=update)
    fit(module, data(arith_jsonl), tmp_path, max_steps=3, callbacks=[alert])
    stale = [f for f in alert.firings if f.signal != "sampler_ess"]
    assert stale and all("1 update(s) behind" in f.message for f in stale)
    amounts = "halve model.optim.learning_rate (0.01 -> 0.005), or lower max_staleness (1 -> 0: synchronous)"
    assert all(amounts in f.message for f in stale)
    assert "same dtype" not in stale[0].message  # not an engine fault
    if correction == "auto":  # bypass: the clip is already at the sampler, and no weight's ESS to watch
        assert "already clips its ratio against the sampler" in stale[0].message and len(stale) == len(alert.firings)
    else:
        assert "update.sampling_correction: bypass" in stale[0].message
        assert any(f.signal == "sampler_ess" for f in alert.firings)


@pytest.mark.parametrize("engine", [ShiftedSampler(0.0), None])  # agreeing sampler; the policy samples itself
def test_silent_when_the_engines_agree_or_the_policy_samples(tiny_model_dir, arith_jsonl, tmp_path, engine):
    alert = MismatchAlert(patience=1, action="raise")
    module = make_module(tiny_model_dir, rollout_engine=engine)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2, callbacks=[alert])
    assert trainer.global_step == 2 and not alert.firings and not alert.counts


def test_the_cli_has_it_on_and_a_run_shows_it(tiny_model_dir, arith_jsonl, tmp_path):
    """``lightning-grpo fit`` with a mismatched sampler: the metrics in metrics.jsonl, the alert in alerts.jsonl."""
    root = tmp_path / "run"
    engine = '{"class_path": "tests.engines.decode.test_hf.ShiftedSampler", "init_args": {"shift": 0.3}}'
    flags = ["--trainer.max_steps", "3", "--trainer.log_every_n_steps", "1", "--trainer.num_sanity_val_steps", "0"]
    flags += ["--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(root), "--data.batch_size", "4"]
    flags += ["--model.model", tiny_model_dir, "--data.dataset", arith_jsonl, "--model.num_generations", "4"]
    flags += ["--model.rollout_engine", engine, "--alerts.mismatch.patience", "2"]
    main(["fit", "--config", "templates/tiny_cpu.yaml", *flags])
    run = next(root.glob("lightning_logs/version_*"))
    rows = [r for r in lines(run / "metrics.jsonl") if "train/loss" in r]
    assert [r["train/sampling/token_mult_prob_error"] for r in rows] == pytest.approx([math.exp(0.3)] * 3, rel=1e-4)
    patterns = metric_patterns(METRICS_TABLE.read_text())
    names = {k for r in rows for k in r if k.startswith("train/")}
    assert "train/alerts/sampler_kl" in names
    assert not [k for k in names if not any(p.fullmatch(k) for p in patterns)]  # alerts included: all documented
    fired = [a for a in lines(run / "alerts.jsonl") if a["alert"] == "MismatchAlert"]
    assert {a["signal"] for a in fired} == {"token_mult_prob_error", "sampler_kl"} and fired[0]["step"] == 2


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"max_token_mult_prob_error must be >= 1 \(1: agreement\), got 0.5"):
        MismatchAlert(max_token_mult_prob_error=0.5)
    with pytest.raises(ValueError, match=r"min_ess must be in \[0, 1\], got 2"):
        MismatchAlert(min_ess=2)
    with pytest.raises(ValueError, match="max_kl must be >= 0, got -1"):
        MismatchAlert(max_kl=-1)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        MismatchAlert(window=0)


def test_the_docstring_example_runs():
    example = re.search(r"Example::\n\n(.*)", MismatchAlert.__doc__, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile("\n".join(line[8:] for line in example.splitlines()), "Example", "exec"), scope)
    assert isinstance(scope["trainer"].callbacks[0], MismatchAlert) or any(
        isinstance(c, MismatchAlert) for c in scope["trainer"].callbacks
    )
