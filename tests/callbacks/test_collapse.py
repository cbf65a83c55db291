"""ModeCollapseAlert on real runs of the tiny model: collapse is caught within its patience and stops the run;
solved groups and a constant reward are told apart from collapse."""

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
    assert {"no_learning_signal", "reward_std", "frac_reward_zero_std"} <= signals
    written = [
        json.loads(line)
        for line in (tmp_path / "lightning_logs/version_0/alerts.jsonl").read_text().split("\n")
        if line
    ]
    assert written[0]["signal"] == "no_learning_signal" and "reward does not discriminate" in written[0]["message"]
    assert any("Try: check the reward functions can tell completions apart" in w["message"] for w in written[1:])
    assert logged(trainer)["train/alerts/reward_std"][-1] == 1.0
    last = torch.load(tmp_path / "lightning_logs/version_0/checkpoints/last.ckpt", weights_only=False)
    assert last["global_step"] == 2 + 3  # the stopped run's last steps are kept


def test_near_zero_temperature_collapses_completions(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="raise")
    module = make_module(tiny_model_dir, sampling={"temperature": 1e-4})
    with pytest.raises(GRPOAlertError, match=r"distinct_completions = 0 < 0.05 for 2 consecutive steps"):
        fit(module, data(arith_jsonl), tmp_path, max_steps=20, callbacks=[alert])


def test_solved_groups_are_reported_as_solved_not_collapse(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="warn", reward_ceiling=0.5)
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=5, callbacks=[alert])
    assert trainer.global_step == 5  # every completion at the ceiling: solved, so only the zero signal is reported
    assert [f.signal for f in alert.firings] == ["no_learning_signal"]
    assert "at reward_ceiling: the task is solved for this data" in alert.firings[0].message


def test_a_constant_reward_at_the_ceiling_without_one_set_is_zero_signal(tiny_model_dir, arith_jsonl, tmp_path):
    """The same run without reward_ceiling: nothing tells solved from a reward that cannot discriminate."""
    alert = ModeCollapseAlert(warmup_steps=1, patience=2, action="warn")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    fit(module, data(arith_jsonl), tmp_path, max_steps=4, callbacks=[alert])
    zero = [f for f in alert.firings if f.signal == "no_learning_signal"]
    assert len(zero) == 1 and "the reward does not discriminate, or the task is solved" in zero[0].message
    assert "Try: check the reward function gives different completions different scores" in zero[0].message
