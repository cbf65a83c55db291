"""MetricsFile: the run's scalars as ``metrics.jsonl`` in its own directory, whatever the logger.

``lightning-grpo report`` reads this file, so runs logged to MLflow, W&B, TensorBoard or CSV (or to no logger)
are reported alike. One JSON object a line: ``{"step": 10, "train/reward": 0.41, ...}``. The CLI adds it to every
run; ``GRPOModule`` writes no file itself, so in your own ``Trainer`` add it to ``callbacks``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.run import run_dir
from lightning_grpo.steplog import loggers_write

FILENAME = "metrics.jsonl"


class MetricsFile(L.Callback):
    """Appends the step's ``train/*`` metrics on the steps the loggers write (``trainer.log_every_n_steps``, and
    the last) and the ``val/*`` metrics after every validation pass (step 0: the sanity check, the "before").

    A run resumed from a checkpoint continues the file; the rows an interrupted run wrote past the checkpoint's step
    are dropped when training starts, as the resumed run writes those steps again: each step appears once.

    Put it after the callbacks that log (``RewardMonitor``, the alerts), so each row holds their values of its step.

    Example::

        trainer = L.Trainer(callbacks=[RewardMonitor(), KLAlert(), MetricsFile()])
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:  # a resumed run: its checkpoint's step, where the file may hold later rows
            drop_rows_after(run_dir(trainer) / FILENAME, trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if loggers_write(trainer):
            self._write(trainer, "train/")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write(trainer, "val/")

    @staticmethod
    def _write(trainer: L.Trainer, prefix: str) -> None:
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix) and v.numel() == 1}
        if not metrics:
            return
        path = run_dir(trainer) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, **metrics}) + "\n")


def drop_rows_after(path: Path, step: int) -> int:
    """Remove the rows of ``path`` logged after ``step`` (rewritten whole, by a rename); returns how many."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.strip() or json.loads(line)["step"] <= step]
    if len(kept) < len(lines):
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text("".join(kept))
        os.replace(partial, path)
    return len(lines) - len(kept)
