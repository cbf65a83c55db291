"""HFExport: saves the trained policy and tokenizer in Hugging Face format when ``fit`` ends."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from lightning_grpo.callbacks.rundir import run_dir


class HFExport(L.Callback):
    """Writes ``save_pretrained`` output so ``AutoModelForCausalLM.from_pretrained(dirpath)`` loads it.

    Args:
        dirpath: where to write; default ``<log_dir>/hf_model``.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath
        self.path: Path | None = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path = Path(self.dirpath) if self.dirpath else run_dir(trainer) / "hf_model"
        if trainer.is_global_zero:
            pl_module.save_pretrained(str(self.path))
        trainer.strategy.barrier("hf_export")
