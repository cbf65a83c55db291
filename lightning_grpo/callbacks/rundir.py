"""The run's own directory, read without a collective call, and the run's ``last.ckpt`` in it.

Every run owns a directory, whatever the logger: ``<save_dir>/<name>/<version>``, the rule Lightning's
``ModelCheckpoint`` follows for its ``checkpoints/`` (TensorBoard and CSV: ``lightning_logs/version_N``; MLflow's
file store: ``mlruns/<experiment_id>/<run_id>``; W&B: ``<save_dir>/<project>/<run_id>``). Without a logger it is
``default_root_dir``, as for Lightning's checkpoints. ``summary.json``, ``samples.jsonl``, ``metrics.jsonl``,
``alerts.jsonl`` and ``hf_model/`` go there, so a second run never writes into the first one's files.

``Trainer.log_dir`` broadcasts from rank 0, so code that runs on one rank only (``rank_zero_only``, an
alert that fired on one rank) would hang the other ranks waiting on it; it also gives MLflow's and W&B's shared
root folder. This reads the logger directly.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L


def run_dir(trainer: L.Trainer) -> Path:
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    if getattr(logger, "log_dir", None):  # TensorBoard, CSV: save_dir/name/version_N (and their sub_dir)
        return Path(logger.log_dir)
    root = Path(logger.save_dir or trainer.default_root_dir)
    version = logger.version
    if version is None and trainer.is_global_zero:  # W&B names its run once the run exists
        _ = logger.experiment
        version = logger.version
    name = "" if logger.name is None else str(logger.name)
    if version is None:
        return root / name
    return root / name / (version if isinstance(version, str) else f"version_{version}")


def save_last_checkpoint(trainer: L.Trainer, dirpath: str | None = None) -> Path:
    """``checkpoints/last.ckpt`` in the run directory (or ``dirpath``); every rank must call it."""
    path = (Path(dirpath) if dirpath else run_dir(trainer) / "checkpoints") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path
