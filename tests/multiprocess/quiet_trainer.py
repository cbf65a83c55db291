"""The Trainer of the multi-process scripts: ``devices`` CPU processes (gloo) and nothing but the run (no logger,
checkpoints, progress bar, model summary or validation), its run files (alerts.jsonl ...) in the test's folder."""

from typing import Any

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy


def quiet_trainer(out_dir: str, max_steps: int, callbacks: list, strategy: Any = "ddp", **kwargs: Any) -> L.Trainer:
    """``strategy``: a Lightning strategy, or ``"fsdp2"`` for FSDP2 (``ModelParallelStrategy``, data parallel over
    the 2 processes); ``kwargs`` override the rest (``devices``, ``accelerator``, ``num_nodes``)."""
    if strategy == "fsdp2":
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    settings = dict(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    return L.Trainer(
        max_steps=max_steps, strategy=strategy, default_root_dir=out_dir, callbacks=callbacks, **{**settings, **kwargs}
    )
