"""The run's log directory, read without a collective call, and the run's ``last.ckpt`` in it.

``Trainer.log_dir`` broadcasts from rank 0, so code that runs on one rank only (``rank_zero_only``, an
alert that fired on one rank) would hang the other ranks waiting on it. This reads the logger directly.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L


def run_dir(trainer: L.Trainer) -> Path:
    logger = trainer.loggers[0] if trainer.loggers else None
    path = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    return Path(path or trainer.default_root_dir)


def save_last_checkpoint(trainer: L.Trainer, dirpath: str | None = None) -> Path:
    """``checkpoints/last.ckpt`` in the run directory (or ``dirpath``); every rank must call it."""
    path = (Path(dirpath) if dirpath else run_dir(trainer) / "checkpoints") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path
