"""ModeCollapseAlert on real runs of the tiny model: collapse is caught within its patience and stops the run;
solved groups are told apart from collapse. No learning signal at all is NoSignalAlert's (test_no_signal.py)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import fit, logged, make_module

from lightning_grpo.callbacks import (
    GRPOAlertError,
    ModeCollapseAlert,
)
from tests.callbacks.test_alerts import constant_reward, data


def test_collapse_is_caught_within_patience_and_stops(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=50, callbacks=[alert])
    assert trainer.global_step == 2 + 3  # warm-up steps, then patience steps of zero reward std
    signals = {f.signal for f in alert.firings}
    assert {"reward_std", "frac_reward_zero_std"} <= signals and "no_learning_signal" not in signals  # NoSignalAlert's
    written = [
        json.loads(line)
        for line in (tmp_path / "lightning_logs/version_0/alerts.jsonl").read_text().split("\n")
        if line
    ]
    assert all("Try: check the reward functions can tell completions apart" in w["message"] for w in written)
    assert logged(trainer)["train/alerts/reward_std"][-1] == 1.0
    last = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=False)
    assert last["global_step"] == 2 + 3  # the stopped run's last steps are kept


def test_near_zero_temperature_collapses_completions(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="raise")
    module = make_module(tiny_model_dir, sampling={"temperature": 1e-4})
    with pytest.raises(GRPOAlertError, match=r"distinct_completions = 0 < 0.05 for 2 consecutive steps"):
        fit(module, data(arith_jsonl), tmp_path, max_steps=20, callbacks=[alert])


def test_solved_groups_are_not_collapse(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="raise", reward_ceiling=0.5)
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=5, callbacks=[alert])
    assert trainer.global_step == 5 and alert.firings == []  # every completion at the ceiling: solved
    without = ModeCollapseAlert(warmup_steps=1, patience=2, action="warn")  # nothing tells solved from collapsed
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    fit(module, data(arith_jsonl), tmp_path / "without", max_steps=3, callbacks=[without])
    assert {f.signal for f in without.firings} >= {"reward_std", "frac_reward_zero_std"}
