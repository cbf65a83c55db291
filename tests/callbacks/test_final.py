"""ValidateAtEnd: a run shorter than an epoch ends validated and checkpointed, and only at its final step."""

from __future__ import annotations

import pytest
from helpers import fit, make_module

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import (
    RunSummary,
    ValidateAtEnd,
)


@pytest.mark.parametrize("at_end", [False, True])
def test_a_run_shorter_than_an_epoch_ends_validated_and_checkpointed(tiny_model_dir, arith_jsonl, tmp_path, at_end):
    """2 steps of a 3-batch epoch: Lightning alone would validate at the epoch's end, which never comes."""
    summary = RunSummary()
    callbacks = [summary, *([ValidateAtEnd()] if at_end else [])]
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)  # 12 training rows: 3 batches
    module = make_module(tiny_model_dir)
    trainer = fit(
        module, data, tmp_path, max_steps=2, callbacks=callbacks, enable_checkpointing=True, limit_val_batches=None
    )
    checkpoints = list((tmp_path / "lightning_logs/version_0/checkpoints").glob("*.ckpt"))
    assert trainer.global_step == 2 and [c.name for c in checkpoints] == ["epoch=0-step=2.ckpt"]
    assert ("val/accuracy" in summary.after) == at_end  # without: the summary's "after" reads n/a


@pytest.mark.parametrize(("max_steps", "max_epochs"), [(4, None), (-1, 2)])
def test_validate_at_end_stops_only_at_the_final_step(tiny_model_dir, arith_jsonl, tmp_path, max_steps, max_epochs):
    """Runs over more than one epoch (3 batches each) end where they are set to, not at an epoch's end."""
    data = PromptDataModule(arith_jsonl, batch_size=4, val_size=4)
    trainer = fit(
        make_module(tiny_model_dir), data, tmp_path, max_steps=max_steps, max_epochs=max_epochs,
        callbacks=[ValidateAtEnd()],
    )  # fmt: skip
    assert trainer.global_step == (4 if max_steps == 4 else 6)
