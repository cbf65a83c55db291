"""The run's log directory, read without a collective call.

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
