"""HFExport: saves the trained policy and tokenizer in Hugging Face format when ``fit`` ends.

The export is written into ``dirpath``, never in place of it: ``dirpath`` may be a mounted volume (``/mnt/models``),
which cannot be removed or renamed (``Device or resource busy``). The files are written first in a hidden
``.hf_export.partial/`` inside it (the same filesystem), flushed to the disk, then each one moved to its final name
with ``os.replace`` (atomic per file); files an earlier export left that this one does not write are removed last.
A kill or a full disk leaves the files of the earlier export, or the new ones, under their names, never a
half-written file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_grpo.run import run_dir


class HFExport(L.Callback):
    """Writes ``save_pretrained`` output so ``AutoModelForCausalLM.from_pretrained(dirpath)`` loads it.

    A LoRA run writes its adapter (``PeftModel.from_pretrained(base, dirpath)`` loads it, with
    ``adapter_config.json`` naming the base model) and, with ``merged: true``, the merged model in
    ``<dirpath>/merged``.

    Args:
        dirpath: where to write. Default ``<run dir>/hf_model``: the run's own directory (see
            ``run.py``). When that already holds files (no logger, or a logger version set by
            hand), ``hf_model-2``, ``hf_model-3`` ... is used instead, with a warning.
        overwrite: replace the files of an existing, non-empty ``dirpath``; otherwise the run refuses to
            start, so a trained model is never overwritten by surprise.
        merged: a LoRA run also writes the merged model in ``<dirpath>/merged``. Base + adapter in full weights.
    """

    def __init__(self, dirpath: str | None = None, overwrite: bool = False, merged: bool = False) -> None:
        self.dirpath = dirpath
        self.overwrite = overwrite
        self.merged = merged
        self.path: Path | None = None

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        target = Path(self.dirpath) if self.dirpath else None
        if target is not None and not self.overwrite and _holds_files(target):
            raise FileExistsError(
                f"export.dirpath {str(target)!r} already holds files: choose a new directory or set "
                "export.overwrite: true"
            )

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.dirpath) if self.dirpath else _unused(run_dir(trainer) / "hf_model", self.overwrite)
        self.path = Path(trainer.strategy.broadcast(str(path)))  # rank 0's choice: it writes
        partial = self.path / PARTIAL  # inside: a mount point's own filesystem, so each file is renamed into place
        if trainer.is_global_zero:
            shutil.rmtree(partial, ignore_errors=True)  # an earlier run's, killed while exporting
        trainer.strategy.barrier("hf_export_start")
        pl_module.save_pretrained(str(partial), merged=self.merged)  # every rank: a sharded policy is gathered
        if trainer.is_global_zero:
            publish_into(partial, self.path)
        trainer.strategy.barrier("hf_export")


PARTIAL = ".hf_export.partial"


def publish_into(partial: Path, target: Path) -> None:
    """Every file of ``partial`` flushed, then moved to the same place under ``target`` (``os.replace``: atomic per
    file); the files of ``target`` that ``partial`` did not hold are removed, then ``partial`` itself. ``target``
    is written into, never replaced: it may be a mount point."""
    files = sorted(f.relative_to(partial) for f in partial.rglob("*") if f.is_file())
    for name in files:
        with open(partial / name, "rb") as f:
            os.fsync(f.fileno())
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial / name, target / name)
    _fsync(target)
    kept = set(files)
    for old in [f for f in target.rglob("*") if f.is_file() and PARTIAL not in f.relative_to(target).parts]:
        if old.relative_to(target) not in kept:
            old.unlink()
    shutil.rmtree(partial)


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _holds_files(path: Path) -> bool:
    return path.is_dir() and any(p.name != PARTIAL for p in path.iterdir())


def _unused(path: Path, overwrite: bool) -> Path:
    """``path``, or when it already holds files, the first free ``path-2``, ``path-3`` ..., said in a warning."""
    if overwrite or not _holds_files(path):
        return path
    n = 2
    while _holds_files(path.with_name(f"{path.name}-{n}")):
        n += 1
    free = path.with_name(f"{path.name}-{n}")
    rank_zero_warn(f"{path} already holds an exported model (another run's): this run's export goes to {free}")
    return free
