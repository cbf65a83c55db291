"""A step's metrics -> Lightning's ``self.log``, at the cost the step can afford. Knows Lightning's public API;
nothing about GRPO.

Lightning's ``self.log`` costs ~0.5 ms a key on CPU (it re-places the key's stored state on the value's device on
every call). A GRPO step has ~25 metrics, so logging all of them every step took a third of a tiny model's step.
Every metric is logged on the steps the loggers write (``Trainer(log_every_n_steps=...)``, as Lightning decides
it); on the other steps, only the ones something reads every step: the ``monitor`` of any callback
(``ModelCheckpoint``, ``EarlyStopping``) and the progress bar's, when there is a bar. So any metric can still be
monitored, and what the loggers and ``metrics.jsonl`` write is always the step's own value.
"""

from __future__ import annotations

from collections.abc import Collection

import lightning as L


def loggers_write(trainer: L.Trainer) -> bool:
    """The loggers write the current training batch's metrics: Lightning's rule (its ``should_update_logs``),
    from its public loop counters: every ``log_every_n_steps``-th batch, and when training is stopping."""
    every = trainer.log_every_n_steps
    if trainer.fast_dev_run:
        return True
    if every == 0:
        return False
    return (trainer.fit_loop.total_batch_idx + 1) % every == 0 or trainer.should_stop


def read_every_step(trainer: L.Trainer) -> set[str]:
    """The metric names a callback monitors (any callback with a ``monitor`` attribute that is a name)."""
    return {cb.monitor for cb in trainer.callbacks if isinstance(getattr(cb, "monitor", None), str)}


def log_train_metrics(module: L.LightningModule, metrics: dict[str, float], prog_bar: Collection[str] = ()) -> None:
    """Logs this step's ``metrics`` (full names) on step: all of them when the loggers write, otherwise the
    monitored ones and, with a progress bar, those in ``prog_bar``."""
    trainer = module.trainer
    if not loggers_write(trainer):
        wanted = read_every_step(trainer) | (set(prog_bar) if trainer.progress_bar_callback is not None else set())
        metrics = {k: v for k, v in metrics.items() if k in wanted}
    shown = {k: v for k, v in metrics.items() if k in prog_bar}
    if shown:
        module.log_dict(shown, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
    rest = {k: v for k, v in metrics.items() if k not in prog_bar}
    if rest:
        module.log_dict(rest, on_step=True, on_epoch=False, batch_size=1)
