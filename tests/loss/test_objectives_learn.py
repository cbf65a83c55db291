"""Every variant of the family learns, on a task where learning is unmistakable within a minute: the embedded
prompts ("max(3,8,1)=") rewarded for answering 7, whatever the digits. The tiny model starts near chance (0.17 at
the first update: it answers one of the prompt's digits) and every variant that follows its reward's gradient ends
above 0.6 within 60 steps (measured 0.87-0.98); one whose update has the wrong sign or no effect stays near 0.17 or
falls.

Why not the embedded task itself: on-policy (``num_iterations=1``) dapo, cispo and vespo take the same update (ratio 1),
yet over 400 steps of "max of three digits" from the earlier warm start (any digit at random) one rose by 0.15 and
another by 0.05 in the same CI run: that task's rise at 400 steps is at the edge of its own noise, so a threshold on it
tests luck. The harder task is the README's demo, tested end to end in ``tests/demo/test_tiny.py``. Slow: ~6 s a
variant.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.demo import materialize
from lightning_grpo.types import step_record

STEPS, WINDOW, LEARNED = 60, 10, 0.6
# name -> GRPOModule settings on top of the demo's
VARIANTS = {
    "dapo": {},
    "grpo": {"loss": {"loss_type": "grpo"}},
    "bnpo": {"loss": {"loss_type": "bnpo"}},
    "dr_grpo": {"loss": {"loss_type": "dr_grpo"}, "advantages": {"scale_rewards": "none"}},
    "gspo": {"loss": {"loss_type": "grpo", "importance_sampling_level": "sequence"}},
    "luspo": {"loss": {"loss_type": "luspo", "importance_sampling_level": "sequence"}},
    "cispo": {"loss": {"loss_type": "cispo", "epsilon_high": 5.0}},
    "sapo": {"loss": {"loss_type": "sapo"}},
    "vespo": {"loss": {"loss_type": "vespo"}},
    "rloo": {"advantages": {"adv_estimator": "rloo"}},
    "reinforce_plus_plus": {"advantages": {"adv_estimator": "reinforce_plus_plus"}},
    "reinforce_plus_plus_baseline": {"advantages": {"adv_estimator": "reinforce_plus_plus_baseline"}},
    "clip_higher_entropy": {"loss": {"epsilon_high": 0.28, "top_entropy_quantile": 0.5}},
    "filter_groups": {"advantages": {"filter_groups": True}},
    "reuse": {"update": {"steps_per_generation": 2}},  # 2 optimiser steps per generation batch: 30 batches
    "off_policy_passes": {"update": {"num_iterations": 2}, "loss": {"loss_type": "cispo", "epsilon_high": 5.0}},
}


def sevens(completions, **kwargs) -> list[float]:
    """1.0 for an answer that starts with 7."""
    return [1.0 if c.strip().startswith("7") else 0.0 for c in completions]


class Rewards(L.Callback):
    def __init__(self):
        self.rewards = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if step_record(outputs):  # filter_groups: no update while groups with signal are gathered
            self.rewards.append(step_record(outputs).stats.rewards.mean)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_learns(variant):
    first, last = train(dict(VARIANTS[variant]), learning_rate=1e-3)
    print(f"{variant}: train reward {first:.3f} -> {last:.3f}")
    assert first < 0.35, (variant, first)  # it started near chance: the rise is learnt, not given
    assert last >= LEARNED, (variant, first, last)


@pytest.mark.slow
def test_without_updates_the_reward_stays_near_chance():
    # the control: the same run whose updates are 1e6 times smaller, so that the threshold above can fail
    first, last = train({}, learning_rate=1e-9)
    assert last < 0.35, (first, last)


def train(settings: dict, learning_rate: float) -> tuple[float, float]:
    """The mean training reward of the first update (the warm start's, before any step) and of the last WINDOW."""
    torch.set_num_threads(1)
    module = GRPOModule(
        model=str(materialize("lightning-grpo/tiny-qwen2")),
        reward_funcs=[sevens],
        num_generations=8,
        sampling={"max_completion_length": 3},
        loss={"beta": 0.1, **settings.pop("loss", {})},
        optim={"learning_rate": learning_rate, "warmup_ratio": 0.05},
        **settings,
    )
    seen = Rewards()
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        callbacks=[seen],
    )
    L.seed_everything(0)
    trainer.fit(module, PromptDataModule(str(materialize("lightning-grpo/tiny-max")), batch_size=8))
    return seen.rewards[0], sum(seen.rewards[-WINDOW:]) / WINDOW
