"""Preemption: any signal that ends a run finishes the current step, saves a checkpoint, then exits. Knows no GRPO
math.

A cluster that preempts a job sends SIGTERM (Kubernetes, ``scancel``) or SIGUSR1 (SLURM's ``--signal=USR1@120``)
and kills it a grace period later; a user presses Ctrl+C (SIGINT) or Ctrl+\\ (SIGQUIT); a dropped SSH session or a
closed terminal sends SIGHUP. Whichever arrives, the optimiser step in flight completes, every rank agrees on the
step to stop at, ``checkpoints/last.ckpt`` is written in the run directory, and the process exits with 128 + the
signal number (143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP, 131 for SIGQUIT, 138 for SIGUSR1), as a shell
reports a process killed by that signal. A second Ctrl+C interrupts at once, without a checkpoint. A run started
with SIGHUP ignored (``nohup``) was started to outlive its terminal: SIGHUP stays ignored and the run goes on to its
end and its export. Output to a terminal that is gone is dropped, never raised (``cli/streams.py``).

Resuming from the checkpoint continues exactly: the data loader's position and shuffling state, the
optimiser, scheduler, step counters and callback states are all in it, and sampling seeds derive from the step.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_grpo.checkpoints import save_last_checkpoint

SIGNALS = {
    "SIGTERM": signal.SIGTERM,
    "SIGINT": signal.SIGINT,
    "SIGHUP": signal.SIGHUP,
    "SIGQUIT": signal.SIGQUIT,
    "SIGUSR1": signal.SIGUSR1,
}
"""The signals that end a run, by name: each saves a checkpoint first."""


class PreemptionCheckpoint(L.Callback):
    """Save ``checkpoints/last.ckpt`` and exit cleanly after the step in flight when a signal arrives.

    Args:
        signals: the signals that request a checkpoint and exit; by default all of SIGTERM, SIGINT, SIGHUP, SIGQUIT
            and SIGUSR1. SIGHUP ignored when training starts (``nohup``) stays ignored.
        dirpath: where to write ``last.ckpt``; defaults to the run directory's ``checkpoints/``.
    """

    def __init__(self, signals: list[str] | None = None, dirpath: str | None = None) -> None:
        signals = list(SIGNALS) if signals is None else signals
        unknown = [s for s in signals if s not in SIGNALS]
        if unknown:
            raise ValueError(f"signals must be a subset of {sorted(SIGNALS)}, got {unknown}")
        self.signals = [SIGNALS[s] for s in signals]
        self.dirpath = dirpath
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.received = None
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn("PreemptionCheckpoint: signal handlers can only be set from the main thread; inactive")
            return
        for signum in self.signals:  # replaces Lightning's SIGTERM handler for the training loop only
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue  # nohup: the run is to outlive its terminal
            self._previous[signum] = signal.signal(signum, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now
        self.received = signum
        rank_zero_info(f"{signal.Signals(signum).name} received: finishing this step, then saving a checkpoint")

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Signals reach ranks at slightly different times: every rank votes each step, so all stop together.
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        path = save_last_checkpoint(trainer, self.dirpath)
        rank_zero_info(f"Checkpoint saved at {path}; resume with --ckpt_path {path}")
        self._restore_handlers()
        signum = self.received or signal.SIGTERM  # a rank that got no signal itself follows the others
        raise SIGTERMException(128 + signum)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
