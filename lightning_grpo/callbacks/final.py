"""ValidateAtEnd: every fit ends with a validation pass and so a checkpoint, whatever its length.

Lightning validates every ``val_check_interval`` batches and at epoch ends; a run that stops at ``max_steps``
in between (a short run, a smoke test) would end unvalidated, with no checkpoint and no "after" in its summary.
Asking the trainer to stop at the last step makes Lightning run its validation loop there (as it does for
early stopping), and the checkpoint callback saves after it.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override


class ValidateAtEnd(L.Callback):
    """Requests the stop at the final step (``max_steps`` reached, or the last batch of the last epoch), so
    that Lightning validates and checkpoints there. Runs without validation data are unaffected."""

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if is_final_step(trainer, batch_idx):
            trainer.should_stop = True


def is_final_step(trainer: L.Trainer, batch_idx: int) -> bool:
    """``max_steps`` reached, or the last batch of the last epoch (``max_epochs`` -1 or None: no epoch limit)."""
    if 0 < trainer.max_steps <= trainer.global_step:
        return True
    epochs = trainer.max_epochs
    last_epoch = epochs is not None and epochs > 0 and trainer.current_epoch + 1 >= epochs
    return last_epoch and batch_idx + 1 >= trainer.num_training_batches
