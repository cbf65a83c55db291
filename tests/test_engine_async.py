"""AsyncRollouts: a producer process samples ahead of the trainer; k = 0 equals the synchronous path, k >= 1 trains
on rollouts at most k updates old with the sampling correction, and checkpoints keep the queue."""

from __future__ import annotations

import torch

from lightning_grpo.data import PromptDataModule
from lightning_grpo.engines import AsyncRollouts
from lightning_grpo.targets.correction import sampling_correction
from tests.helpers import fit, logged, make_module


def data(arith_jsonl):
    return PromptDataModule(arith_jsonl, batch_size=4, val_split=None)  # 16 rows: 4 steps per epoch


def weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.policy.model.parameters()]


def test_k0_updates_equal_the_synchronous_path(tiny_model_dir, arith_jsonl, tmp_path):
    # the producer process samples each step's batch from the step's RNG state and the weights of that step
    sync = make_module(tiny_model_dir)
    fit(sync, data(arith_jsonl), tmp_path / "sync", max_steps=3)
    k0 = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=0))
    trainer = fit(k0, data(arith_jsonl), tmp_path / "k0", max_steps=3)
    for a, b in zip(weights(sync), weights(k0)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert logged(trainer)["train/async/staleness/max"] == [0.0, 0.0, 0.0]
    assert k0.engine.process is None  # ended with the fit


def test_k1_trains_one_step_behind_with_the_correction(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, rollout_engine=AsyncRollouts(max_staleness=1))
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=3)
    metrics = logged(trainer)
    assert trainer.global_step == 3
    # the first batch only filled the pipeline; after it, every batch was sampled one update earlier
    assert metrics["train/async/staleness/max"] == [0.0, 1.0, 1.0]
    assert len(metrics["train/sampling/importance_sampling_ratio/mean"]) == 2  # corrected when stale
    assert module.engine.version == 3
