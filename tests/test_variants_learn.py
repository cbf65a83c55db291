"""Every variant of the family learns the embedded task (the README's "max of three digits" on the tiny model):
the training reward of the last steps beats the first steps' by a clear margin. Slow: ~35 s a variant."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.demo import materialize
from lightning_grpo.rewards import exact_match_reward

STEPS, WINDOW = 400, 40
VARIANTS = {  # name -> GRPOModule settings on top of the demo's
    "dapo": {},
    "grpo": {"loss": {"loss_type": "grpo"}},
    "bnpo": {"loss": {"loss_type": "bnpo"}},
    "dr_grpo": {"loss": {"loss_type": "dr_grpo"}, "advantages": {"scale_rewards": "none"}},
    "gspo": {"loss": {"importance_sampling_level": "sequence"}},
    "luspo": {"loss": {"loss_type": "luspo"}},
    "cispo": {"loss": {"loss_type": "cispo", "epsilon_high": 5.0}},
    "sapo": {"loss": {"loss_type": "sapo"}},
    "vespo": {"loss": {"loss_type": "vespo"}},
    "rloo": {"advantages": {"adv_estimator": "rloo"}},
    "reinforce_plus_plus": {"advantages": {"adv_estimator": "reinforce_plus_plus"}},
    "reinforce_plus_plus_baseline": {"advantages": {"adv_estimator": "reinforce_plus_plus_baseline"}},
    "clip_higher_entropy": {"loss": {"epsilon_high": 0.28, "top_entropy_quantile": 0.5}},
    "filter_groups": {"advantages": {"filter_groups": True}},
    "reuse": {"steps_per_generation": 2, "num_iterations": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_learns_the_embedded_task(variant, tmp_path):
    torch.set_num_threads(1)
    settings = dict(VARIANTS[variant])
    module = GRPOModule(
        model=str(materialize("lightning-grpo/tiny-qwen2")),
        reward_funcs=[exact_match_reward],
        num_generations=8,
        sampling={"max_completion_length": 3},
        loss={"beta": 0.1, **settings.pop("loss", {})},
        **settings,
        optim={"learning_rate": 1e-3, "warmup_ratio": 0.05},
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
    assert last >= first + 0.15, (variant, first, last)
