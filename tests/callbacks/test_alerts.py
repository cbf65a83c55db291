"""The alerts' common ground, driven by real runs on the tiny model: their state survives a checkpoint, bad settings
are named."""

from __future__ import annotations

import pytest
import torch
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import (
    KLAlert,
    ModeCollapseAlert,
)


def constant_reward(completions, **kwargs):
    """A reward that cannot tell completions apart: every group has zero std, GRPO learns nothing."""
    return [0.5] * len(completions)


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def test_alert_state_round_trips_through_a_checkpoint(tiny_model_dir, arith_jsonl, tmp_path):
    alert = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    module = make_module(tiny_model_dir, reward_funcs=[constant_reward], accuracy_reward=None)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=50, callbacks=[alert], enable_checkpointing=True)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    restored = ModeCollapseAlert(warmup_steps=2, patience=3, action="stop")
    restored.load_state_dict(next(v for k, v in ckpt["callbacks"].items() if k.startswith("ModeCollapseAlert")))
    assert restored.counts == alert.counts and restored.early == alert.early
    assert [f.message for f in restored.firings] == [f.message for f in alert.firings]


def test_bad_alert_settings_are_named():
    with pytest.raises(ValueError, match=r"action must be one of \['warn', 'stop', 'raise'\], got 'panic'"):
        ModeCollapseAlert(action="panic")
    with pytest.raises(ValueError, match="patience must be >= 1, got 0"):
        KLAlert(patience=0)
