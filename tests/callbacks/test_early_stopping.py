"""StepEarlyStopping acts on training steps in a real fit, where Lightning's EarlyStopping on a ``train/*`` metric
waits for a validation pass that a GRPO run may never reach; ModelCheckpoint saves on training steps alike."""

from __future__ import annotations

import warnings

import pytest
from helpers import fit, make_module
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import StepEarlyStopping

# min_delta 10: the reward (at most 2 here) can never improve by that much, so every check after the first one
# counts as no improvement: patience 2 stops at step 1 + 2 = 3, whatever the model samples.
NEVER_IMPROVES = dict(monitor="train/reward", mode="max", patience=2, min_delta=10.0)


def run(tiny_model_dir, arith_jsonl, tmp_path, callbacks, **trainer_kw):
    data = PromptDataModule(arith_jsonl, batch_size=2)  # 8 batches a 16-prompt epoch: 6 steps stay in one epoch
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
        return fit(make_module(tiny_model_dir), data, tmp_path, max_steps=6, callbacks=callbacks, **trainer_kw)


def test_step_early_stopping_stops_on_a_training_metric(tiny_model_dir, arith_jsonl, tmp_path):
    stop = StepEarlyStopping(**NEVER_IMPROVES)
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="train/reward", mode="max", every_n_train_steps=1)
    trainer = run(tiny_model_dir, arith_jsonl, tmp_path, [stop, best], enable_checkpointing=True)
    assert trainer.global_step == 3 and stop.wait_count == 2
    assert "train/reward" in stop.stopping_reason_message
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [best.best_model_path.split("/")[-1]]
    assert "step=" in best.best_model_path  # saved on a training step, with no validation in the run


def test_lightnings_early_stopping_never_checks_a_run_without_validation(tiny_model_dir, arith_jsonl, tmp_path):
    stop = EarlyStopping(**NEVER_IMPROVES)
    assert run(tiny_model_dir, arith_jsonl, tmp_path, [stop]).global_step == 6 and stop.wait_count == 0


def test_check_on_train_epoch_end_is_refused():
    with pytest.raises(ValueError, match="drop check_on_train_epoch_end"):
        StepEarlyStopping(monitor="train/reward", check_on_train_epoch_end=False)
