"""Every variant of the family learns the embedded task (the README's "max of three digits" on the tiny model):
the training reward of the last steps beats the first steps' by a clear margin, or for the four measured slow on
this task (see VARIANTS) at least a little. Slow: ~35 s a variant."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.demo.tiny import materialize
from lightning_grpo.rewards import exact_match_reward

STEPS, WINDOW = 400, 40
# name -> (GRPOModule settings on top of the demo's, the least rise of the training reward in STEPS steps).
# Most variants rise by 0.25-0.55 here. Four rise slowly on this task at the demo's learning rate, measured
# (+0.02 to +0.09 in 400 steps; 3e-3 did not speed them up): dr_grpo and rloo (no std scaling: a binary reward's
# std is ~0.3 here, so 3x smaller advantages), gspo (one ratio per sequence, each token's gradient divided by the
# length), REINFORCE++ with a group baseline (batch whitening of mostly-zero rewards); rollout reuse sees half the
# generation batches. For those the
# test asserts that the reward rises at all; SKILL.md's table says so.
LEARNS, SLOW = 0.15, 0.01
VARIANTS = {
    "dapo": ({}, LEARNS),
    "grpo": ({"loss": {"loss_type": "grpo"}}, LEARNS),
    "bnpo": ({"loss": {"loss_type": "bnpo"}}, LEARNS),
    "dr_grpo": ({"loss": {"loss_type": "dr_grpo"}, "advantages": {"scale_rewards": "none"}}, SLOW),
    "gspo": ({"loss": {"loss_type": "grpo", "importance_sampling_level": "sequence"}}, SLOW),
    "luspo": ({"loss": {"loss_type": "luspo", "importance_sampling_level": "sequence"}}, LEARNS),
    "cispo": ({"loss": {"loss_type": "cispo", "epsilon_high": 5.0}}, LEARNS),
    "sapo": ({"loss": {"loss_type": "sapo"}}, LEARNS),
    "vespo": ({"loss": {"loss_type": "vespo"}}, LEARNS),
    "rloo": ({"advantages": {"adv_estimator": "rloo"}}, SLOW),
    "reinforce_plus_plus": ({"advantages": {"adv_estimator": "reinforce_plus_plus"}}, LEARNS),
    "reinforce_plus_plus_baseline": ({"advantages": {"adv_estimator": "reinforce_plus_plus_baseline"}}, SLOW),
    "clip_higher_entropy": ({"loss": {"epsilon_high": 0.28, "top_entropy_quantile": 0.5}}, LEARNS),
    "filter_groups": ({"advantages": {"filter_groups": True}}, LEARNS),
    "reuse": ({"steps_per_generation": 2}, SLOW),  # 2 optimiser steps per generation batch: half the batches
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_learns_the_embedded_task(variant, tmp_path):
    torch.set_num_threads(1)
    settings, least_rise = VARIANTS[variant]
    settings = dict(settings)
    module = GRPOModule(
        model=str(materialize("lightning-grpo/tiny-qwen2")),
        reward_funcs=[exact_match_reward],
        num_generations=8,
        sampling={"max_completion_length": 3},
        loss={"beta": 0.1, **settings.pop("loss", {})},
        optim={"learning_rate": 1e-3, "warmup_ratio": 0.05, **settings.pop("optim", {})},
        **settings,
    )
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        log_every_n_steps=1,
    )
    L.seed_everything(0)
    data = PromptDataModule(str(materialize("lightning-grpo/tiny-max")), batch_size=16)
    trainer.fit(module, data)
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        rewards = [float(r["train/reward"]) for r in csv.DictReader(f) if r.get("train/reward")]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"{variant}: train reward {first:.3f} -> {last:.3f} in {len(rewards)} logged steps")
    assert last >= first + least_rise, (variant, first, last)
