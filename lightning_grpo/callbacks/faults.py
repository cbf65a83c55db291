"""FaultCheckpoint: any exception inside ``fit`` keeps what was trained, and the run directory keeps the trace.

A reward function that raises, a row that cannot be read, a loss that fails, an alert with action ``raise``: on
every way out of ``fit`` through an exception, after at least one optimiser step, ``checkpoints/last.ckpt`` is
written in the run directory first (as ``PreemptionCheckpoint`` does on SIGTERM), and the exception carries its
path (``exception.checkpoint_path``) for the message that names the resume command. The full traceback goes to
``<run dir>/error.log`` (``exception.error_log``), so the command line can show one line and keep the trace.

Under several processes a checkpoint is a collective that the ranks which did not fail are not in (they wait in
their own collective): no checkpoint is written there, and the message says so; the periodic checkpoints remain.
An exception every rank raises at the same point (``exception.every_rank``: ``VLLMServer``'s ``NoServerLeft``,
agreed by the ranks) is the exception: every rank is here, and the checkpoint is written.
The batch that failed counts as drawn: a resumed run goes on with the next one.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_grpo.checkpoints import save_last_checkpoint
from lightning_grpo.run import run_dir

NO_CHECKPOINT = (KeyboardInterrupt, SIGTERMException)  # a second Ctrl+C stops at once; SIGTERM saved its own


class FaultCheckpoint(L.Callback):
    """Save ``checkpoints/last.ckpt`` and ``error.log`` in the run directory when ``fit`` fails.

    Args:
        dirpath: where to write ``last.ckpt``; defaults to the run directory's ``checkpoints/``.

    Example::

        trainer = L.Trainer(callbacks=[FaultCheckpoint()])
    """

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, NO_CHECKPOINT):
            return
        if trainer.is_global_zero:
            exception.error_log = str(_write_log(run_dir(trainer), exception))
        if getattr(exception, "checkpoint_path", None) or trainer.global_step == 0:
            return  # saved already (numerical_abort), or nothing trained yet
        if trainer.world_size > 1 and not getattr(exception, "every_rank", False):
            exception.add_note(f"no checkpoint written: {trainer.world_size} processes, not all of them failed")
            return
        try:
            exception.checkpoint_path = str(save_last_checkpoint(trainer, self.dirpath))
        except Exception as err:  # a full disk: the original error stays the one raised
            exception.add_note(f"the checkpoint could not be written either: {type(err).__name__}: {err}")


def _write_log(directory: Path, exception: BaseException) -> Path | None:
    """The full traceback in ``directory/error.log``; ``None`` when it cannot be written (a read-only disk)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "error.log"
        path.write_text("".join(traceback.format_exception(exception)))
        return path
    except OSError:
        return None
