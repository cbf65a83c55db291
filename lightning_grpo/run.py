"""The run as the trainer holds it: its own directory, and the version it takes there. Knows Lightning's public API;
nothing about GRPO.

Every run owns a directory, whatever the logger: ``<save_dir>/<name>/<version>``, the rule Lightning's
``ModelCheckpoint`` follows for its ``checkpoints/`` (TensorBoard and CSV: ``lightning_logs/version_N``; MLflow's
file store: ``mlruns/<experiment_id>/<run_id>``; W&B: ``<save_dir>/<project>/<run_id>``). Without a logger it is
``default_root_dir``, as for Lightning's checkpoints. ``summary.json``, ``samples.jsonl``, ``metrics.jsonl``,
``alerts.jsonl``, ``hf_model/`` and every checkpoint GRPO writes itself go there, so a second run never writes
into the first one's files. ``Trainer.log_dir`` broadcasts from rank 0, so code that runs on one rank only
(``rank_zero_only``, an alert that fired on one rank) would hang the other ranks waiting on it; it also gives
MLflow's and W&B's shared root folder. ``run_dir`` reads the logger directly.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

# The version a run took (``own_version``), for the ranks Lightning's launcher starts: they inherit the environment
RUN_VERSION = "LIGHTNING_GRPO_RUN_VERSION"
# Set when another tool started every process (torchrun, SLURM, mpirun): each numbers its run as Lightning does
EXTERNAL_RANKS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


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


def numbered_logger(trainer: L.Trainer) -> CSVLogger | TensorBoardLogger | None:
    """The trainer's one logger when it numbers its runs ``version_N`` under a root (TensorBoard, CSV), else
    ``None``."""
    logger = trainer.logger
    return logger if type(logger) in (CSVLogger, TensorBoardLogger) and len(trainer.loggers) == 1 else None


def log_into(trainer: L.Trainer, logger: CSVLogger | TensorBoardLogger, version: int | str) -> None:
    """``logger`` again, writing into ``version`` of its root (a number: ``version_N``, which the progress bar
    shows whole)."""
    trainer.loggers = [type(logger)(save_dir=logger.save_dir, name=logger.name, version=version)]


def version_number(name: str) -> int | None:
    """N of a ``version_N`` directory's name, else ``None``.

    >>> version_number("version_12"), version_number("12"), version_number("version_x")
    (12, None, None)
    """
    number = name.removeprefix("version_")
    return int(number) if name.startswith("version_") and number.isdigit() else None


def own_version(trainer: L.Trainer) -> int | None:
    """Give a run with the default logger (TensorBoard or CSV, versions numbered under its root) a ``version_N`` no
    other run has, taken with ``mkdir``: two runs started at once in one ``default_root_dir`` both listed the root,
    both took ``version_0`` and wrote over each other's files. Set for the ranks Lightning's launcher starts (they
    inherit ``RUN_VERSION``); the version taken, to be dropped from the environment when ``fit`` ends, or ``None``.
    """
    logger = numbered_logger(trainer)
    if logger is None:
        return None
    inherited = os.environ.get(RUN_VERSION)
    taken = None
    if inherited is None:
        if any(os.environ.get(k) for k in EXTERNAL_RANKS):
            return None
        taken = take_version(Path(logger.root_dir))
        os.environ[RUN_VERSION] = str(taken)
    log_into(trainer, logger, taken if inherited is None else int(inherited))
    return taken


def take_version(root: Path) -> int:
    """The lowest N above every ``version_N`` under ``root``, its directory created there (``mkdir`` fails for the
    second of two processes, which takes the next).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "version_3").mkdir()
    >>> take_version(root), take_version(root), sorted(p.name for p in root.iterdir())
    (4, 5, ['version_3', 'version_4', 'version_5'])
    """
    root.mkdir(parents=True, exist_ok=True)
    numbers = [n for p in root.iterdir() if (n := version_number(p.name)) is not None]
    n = max(numbers, default=-1) + 1
    while True:
        try:
            (root / f"version_{n}").mkdir()
            return n
        except FileExistsError:
            n += 1
