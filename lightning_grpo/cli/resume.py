"""``--ckpt_path``: which checkpoint a run resumes from, and the run directory it continues. Knows the trainer's
loggers and checkpoint files; nothing about GRPO.

``--ckpt_path last`` is the newest readable checkpoint of the run, across its versions (``version_0``,
``version_1`` ... of the logger's name, and any ``ModelCheckpoint.dirpath``); each unreadable newer one is skipped
with a warning naming it and why. An explicit path that cannot be read is refused, naming the newest readable one.
With the default logger (CSV or TensorBoard under ``default_root_dir``), the resumed run continues the
checkpoint's own ``version_N`` directory: one directory holds the run's metrics, alerts and summary.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_grpo.checkpoints import last_readable, run_checkpoints, unreadable
from lightning_grpo.run import run_dir


def search_roots(trainer: L.Trainer) -> list[Path]:
    """The run's root (``<save_dir>/<name>``, above its versions; ``default_root_dir`` without a logger) and the
    ``dirpath`` of every ``ModelCheckpoint``."""
    roots = [run_dir(trainer).parent if trainer.loggers else Path(trainer.default_root_dir)]
    roots += [Path(cb.dirpath).parent for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)]
    return list(dict.fromkeys(roots))


def candidates(trainer: L.Trainer) -> list[Path]:
    found = {p for root in search_roots(trainer) if root.is_dir() for p in run_checkpoints(root)}
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def resume_path(trainer: L.Trainer, ckpt_path: str | Path | None) -> str | None:
    """The checkpoint to resume from for ``--ckpt_path`` (``None``: start afresh)."""
    if ckpt_path is None or str(ckpt_path) in ("hpc", "best", "registry") or str(ckpt_path).startswith("registry:"):
        return None if ckpt_path is None else str(ckpt_path)  # Lightning's own meanings
    if str(ckpt_path) == "last":
        found, skipped = last_readable(candidates(trainer))
        for line in skipped:
            rank_zero_warn(f"--ckpt_path last: skipping an unreadable checkpoint, {line}")
        if found is None:
            roots = ", ".join(str(r) for r in search_roots(trainer))
            rank_zero_warn(f"--ckpt_path last: no readable checkpoint under {roots}; training starts at step 0")
            return None
        rank_zero_info(f"--ckpt_path last: resuming from {found}")
        return str(found)
    why = unreadable(ckpt_path)
    if why is not None:
        good, _ = last_readable(candidates(trainer))
        other = f"; the newest readable checkpoint of this run is {good} (or --ckpt_path last)" if good else ""
        raise ValueError(f"--ckpt_path {str(ckpt_path)!r} cannot be resumed from: {why}{other}")
    return str(ckpt_path)


def continue_run_dir(trainer: L.Trainer, ckpt_path: str) -> None:
    """With a default CSV/TensorBoard logger, log into the checkpoint's own ``version_N`` (``.../version_N/
    checkpoints/x.ckpt``) when it is a version of this logger's root, instead of starting ``version_N+1``."""
    logger = trainer.logger
    if type(logger) not in (CSVLogger, TensorBoardLogger) or len(trainer.loggers) != 1:
        return
    run = Path(ckpt_path).resolve().parent.parent
    if Path(ckpt_path).parent.name != "checkpoints" or run.parent != Path(logger.root_dir).resolve():
        return
    # CSVLogger warns that the directory "exists and is not empty": the run appends to its own files
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    trainer.loggers = [type(logger)(save_dir=logger.save_dir, name=logger.name, version=run.name)]
    rank_zero_info(f"Resuming run {run}: its metrics, alerts and summary continue there")


def refuse_unreadable(ckpt_path: str) -> None:
    """An explicit ``--ckpt_path`` file that cannot be read is refused before anything loads (Lightning's CLI reads
    its settings first), naming the newest readable checkpoint of the same run."""
    why = unreadable(ckpt_path)
    if why is None:
        return
    path = Path(ckpt_path).resolve()
    root = path.parent.parent.parent if path.parent.name == "checkpoints" else path.parent
    good, _ = last_readable([p for p in run_checkpoints(root) if p.resolve() != path])
    other = f"; the newest readable checkpoint of this run is {good}" if good else ""
    raise ValueError(f"--ckpt_path {ckpt_path!r} cannot be resumed from: {why}{other}")


def model_mismatch(ckpt_path: str, configured: object, default: object, resumed: object) -> str | None:
    """Why the checkpoint may not be resumed with this config: it trained another model than the one configured
    (Lightning's CLI would quietly take the checkpoint's). ``None`` when they agree or no model was configured."""
    if configured is None or str(configured) == str(default) or str(configured) == str(resumed):
        return None
    return (
        f"--ckpt_path {ckpt_path!r} holds a run of model {str(resumed)!r}, but the config trains model "
        f"{str(configured)!r}: resume with that run's model, or start a new run without --ckpt_path"
    )
