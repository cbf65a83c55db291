"""StepProgressBar: ``Epoch 3 · step 180/1000`` and a bar that ends full, for runs counted in optimiser steps.

Lightning's bars count batches: with ``max_steps`` and ``num_iterations`` optimiser steps per batch the bar's total
is ``max_steps`` batches, of which only ``max_steps / num_iterations`` run, and Rich's bar reads ``Epoch 0/-2``
(``max_epochs`` is -1 when ``max_steps`` bounds the run). The CLI uses this bar unless another is configured.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, described as ``Epoch E · step S/max_steps`` and sized in batches still to run."""

    @property
    @override
    def total_train_batches(self) -> int | float:
        trainer = self.trainer
        if trainer.max_steps is None or trainer.max_steps < 0:
            return trainer.num_training_batches
        update = trainer.lightning_module.hparams.get("update") or {}  # a GRPOModule's optimiser steps per batch:
        steps_per_batch = max(update.get("num_iterations", 1) * update.get("steps_per_generation", 1), 1)  # mu passes
        left = math.ceil((trainer.max_steps - trainer.global_step) / steps_per_batch)
        return min(trainer.num_training_batches, left)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.train_progress_bar is not None:
            self.train_progress_bar.set_description(self.description(trainer), refresh=False)

    @staticmethod
    def description(trainer: L.Trainer) -> str:
        steps = f"/{trainer.max_steps}" if trainer.max_steps is not None and trainer.max_steps > 0 else ""
        return f"Epoch {trainer.current_epoch} · step {trainer.global_step}{steps}"
