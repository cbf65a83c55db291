"""HFExport: saves the trained policy and tokenizer in Hugging Face format when ``fit`` ends."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.rundir import run_dir


class HFExport(L.Callback):
    """Writes ``save_pretrained`` output so ``AutoModelForCausalLM.from_pretrained(dirpath)`` loads it.

    Args:
        dirpath: where to write; default ``<log_dir>/hf_model`` (a new directory for every run).
        overwrite: replace the files of an existing, non-empty ``dirpath``; otherwise the run refuses to
            start, so a trained model is never overwritten by surprise.
    """

    def __init__(self, dirpath: str | None = None, overwrite: bool = False) -> None:
        self.dirpath = dirpath
        self.overwrite = overwrite
        self.path: Path | None = None

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        target = Path(self.dirpath) if self.dirpath else None
        if target is not None and not self.overwrite and target.is_dir() and any(target.iterdir()):
            raise FileExistsError(
                f"export.dirpath {str(target)!r} already holds files: choose a new directory or set "
                "export.overwrite: true"
            )

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path = Path(self.dirpath) if self.dirpath else run_dir(trainer) / "hf_model"
        pl_module.save_pretrained(str(self.path))  # every rank: a sharded policy is gathered; rank 0 writes
        trainer.strategy.barrier("hf_export")
