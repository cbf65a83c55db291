"""TRL's metrics under TRL's names and definitions: grad_norm, clip_ratio/low_min and high_max,
completions/{min,max}_terminated_length (trl 1.16 ``GRPOTrainer._compute_loss`` and ``_generate_and_score``)."""

from __future__ import annotations

import math

import lightning as L
import torch
from helpers import fit, logged, make_module
from trl.trainer.utils import nanmax, nanmin

from lightning_grpo import PromptDataModule
from lightning_grpo.loss.grpo import grpo_loss
from lightning_grpo.metrics import length_stats
from lightning_grpo.types import step_record


def trl_extremes(logps, old_logps, advantages, mask, epsilon=0.2):
    """TRL's lines: per-completion masked means of the clip flags, then nanmin / nanmax."""
    coef_1 = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(1)
    low = ((coef_1 < 1 - epsilon) & (adv < 0)).float()
    high = ((coef_1 > 1 + epsilon) & (adv > 0)).float()

    def masked_seq_mean(x):
        return (x * mask).sum(-1) / mask.sum(-1)

    return nanmin(masked_seq_mean(low)).item(), nanmax(masked_seq_mean(high)).item()


def test_clip_extremes_match_trl_and_combine_over_micro_batches():
    torch.manual_seed(0)
    logps, old = torch.randn(6, 5) * 0.3 - 1, torch.full((6, 5), -1.0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    whole = grpo_loss(logps, old, advantages, mask).metrics()
    low_min, high_max = trl_extremes(logps, old, advantages, mask)
    assert whole["clip_ratio/low_min"] == low_min and whole["clip_ratio/high_max"] == high_max
    assert 0 < high_max  # the case tests something: some completion has high-clipped tokens
    parts = [grpo_loss(logps[r], old[r], advantages[r], mask[r]) for r in (slice(0, 2), slice(2, 4), slice(4, 6))]
    combined = (parts[0] + parts[1] + parts[2]).metrics()
    assert combined["clip_ratio/low_min"] == low_min and combined["clip_ratio/high_max"] == high_max


def test_clip_extremes_hand_worked():
    # completion 0: 1 of 2 tokens above 1 + 0.2 with A > 0 -> 0.5; completion 1: 2 of 2 below 1 - 0.2 with A < 0 -> 1.0
    logps = torch.log(torch.tensor([[1.5, 1.0], [0.5, 0.5]]))
    out = grpo_loss(logps, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2)).metrics()
    assert out["clip_ratio/high_max"] == 0.5 and out["clip_ratio/low_min"] == 0.0  # completion 0 has no low clip


def test_terminated_lengths_as_trl_including_none_terminated():
    stats = length_stats(torch.tensor([3, 8, 5, 8]), torch.tensor([False, True, False, True]))
    assert (stats.min_terminated, stats.max_terminated, stats.mean_terminated) == (3.0, 5.0, 4.0)
    none = length_stats(torch.tensor([8, 8]), torch.tensor([True, True])).metrics()
    assert none["completions/min_terminated_length"] == none["completions/max_terminated_length"] == 0.0


class Records(L.Callback):
    def __init__(self):
        self.records = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.records.append(step_record(outputs))


def test_a_run_logs_grad_norm_and_the_trl_metrics(tiny_model_dir, arith_jsonl, tmp_path):
    probe = Records()
    module = make_module(
        tiny_model_dir, update={"num_iterations": 2}, optim={"learning_rate": 0.05, "max_grad_norm": 1e-3}
    )
    trainer = fit(
        module, PromptDataModule(arith_jsonl, batch_size=4, val_split=None), tmp_path, max_steps=4, callbacks=[probe]
    )
    metrics = logged(trainer)
    for name in ("grad_norm", "clip_ratio/low_min", "clip_ratio/high_max",
                 "completions/min_terminated_length", "completions/max_terminated_length"):  # fmt: skip
        assert len(metrics[f"train/{name}"]) == 2, name  # 2 training steps of 2 optimiser steps
    # clipped to 1e-3, the norm logged is the one before clipping: far above it, as the HF Trainer logs it
    assert all(n > 1e-2 and math.isfinite(n) for n in metrics["train/grad_norm"])
    record = probe.records[-1]
    lengths = record.rollout.completion_mask.sum(1)[~record.rollout.is_truncated].float()
    assert metrics["train/completions/max_terminated_length"][-1] == (lengths.max().item() if len(lengths) else 0.0)
    assert metrics["train/completions/min_terminated_length"][-1] == (lengths.min().item() if len(lengths) else 0.0)
