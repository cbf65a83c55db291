"""Alert: the shared mechanics of the run monitors (patience, action, cross-rank decision, window, state, records).

A subclass only says which signals are active at a step; this class counts consecutive active steps, fires
once a signal has lasted ``patience`` steps, then warns, stops the Trainer or raises, the same on every rank.
A subclass that judges a signal over its last steps (a median, a growth, two means) asks ``remember`` for them:
this class keeps each series, ``kept()`` values long, and saves it in checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_grpo.checkpoints import save_last_checkpoint
from lightning_grpo.run import run_dir
from lightning_grpo.types import StepRecord, step_record

ACTIONS = ("warn", "stop", "raise")


class GRPOAlertError(RuntimeError):
    """Raised by an alert whose action is ``raise``."""


@dataclass
class Signal:
    name: str  # e.g. "reward_std"
    value: float
    threshold: float
    relation: str  # "<" or ">": how value compares with threshold while the signal is active
    advice: str  # what to try
    diagnosis: str = ""  # what the signal means, when its name does not say it


@dataclass
class Firing:
    step: int
    alert: str
    signal: str
    value: float
    threshold: float
    message: str


class Alert(L.Callback):
    """Base of the run alerts (``ModeCollapseAlert``, ``KLAlert``, ``MismatchAlert`` ...).

    Args:
        patience: steps in a row a signal lasts before firing (training steps).
        action: ``warn`` (a warning, training goes on), ``stop`` (``trainer.should_stop`` after saving
            ``checkpoints/last.ckpt``) or ``raise`` (``GRPOAlertError``).
        window: steps a subclass judges a signal over (``remember``); ``None`` for one that judges each step alone.
    """

    # The one series of a subclass that kept a single one: checkpoints written before the base kept the series
    # (issue 56) saved it as a bare list under "history".
    one_series: str | None = None

    def __init__(self, patience: int = 10, action: str = "warn", window: int | None = None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {list(ACTIONS)}, got {action!r}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.patience = patience
        self.action = action
        self.window = window
        self.counts: dict[str, int] = {}
        self.firings: list[Firing] = []
        self.history: dict[str, list[float]] = {}  # each remembered series, its last kept() values

    @property
    @override
    def state_key(self) -> str:
        """Two alerts of one class with different settings keep their states apart in a checkpoint."""
        return f"{type(self).__qualname__}{self.settings()}"

    def settings(self) -> dict[str, Any]:
        """What tells this alert apart from another of its class; subclasses add their thresholds."""
        return {"patience": self.patience, "action": self.action}

    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        """The signals active at this step; subclasses implement it."""
        raise NotImplementedError

    def observe(self, trainer: L.Trainer, outputs: Any, batch: Any) -> list[Signal] | None:
        """The signals active after a training batch: those of its step record; ``None`` when it has none (a step
        skipped for non-finite numbers, a batch drawn without an update), which tells this alert nothing."""
        record = step_record(outputs)
        return None if record is None else self.signals(trainer, record)

    def kept(self) -> int:
        """How many of a series' last values ``remember`` keeps: ``window``, unless a subclass needs more."""
        if self.window is None:
            raise TypeError(f"{type(self).__name__} has no window: it remembers no series")
        return self.window

    def remember(self, name: str, value: float) -> list[float]:
        """``name``'s last ``kept()`` values, this step's ``value`` the last of them (fewer at the start)."""
        self.history[name] = [*self.history.get(name, []), value][-self.kept() :]
        return list(self.history[name])

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        found = self.observe(trainer, outputs, batch)
        if found is None:  # the batch tells nothing; ranks skip together
            trainer.strategy.reduce_boolean_decision(False, all=False)
            return
        active = {s.name: s for s in found}
        self.counts = {name: self.counts.get(name, 0) + 1 for name in active}  # inactive signals reset to 0
        due = [s for s in active.values() if self.counts[s.name] == self.patience]
        for signal in due:
            self._record(trainer, signal)
        for name in active:
            pl_module.log(f"train/alerts/{name}", float(self.counts[name] >= self.patience), on_step=True, batch_size=1)
        # Every rank takes part in the reduction each step, so ranks act together.
        if trainer.strategy.reduce_boolean_decision(bool(due), all=False):
            self._act(trainer)

    def _record(self, trainer: L.Trainer, s: Signal) -> None:
        diagnosis = f": {s.diagnosis}" if s.diagnosis else ""
        message = (
            f"{type(self).__name__} at step {trainer.global_step}: {s.name} = {s.value:.4g} {s.relation} "
            f"{s.threshold:.4g} for {self.patience} consecutive steps{diagnosis}. Try: {s.advice}"
        )
        firing = Firing(trainer.global_step, type(self).__name__, s.name, s.value, s.threshold, message)
        self.firings.append(firing)
        if trainer.is_global_zero:
            path = run_dir(trainer) / "alerts.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(asdict(firing)) + "\n")
        rank_zero_warn(message)

    def _act(self, trainer: L.Trainer) -> None:
        latest = self.firings[-1].message if self.firings else f"{type(self).__name__} fired on another rank"
        if self.action == "raise":
            raise GRPOAlertError(latest)
        if self.action == "stop":
            path = save_last_checkpoint(trainer)  # the run ends here: keep its last steps
            rank_zero_warn(f"Training stopped; checkpoint at {path} (resume with --ckpt_path after a fix)")
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        history = {name: list(values) for name, values in self.history.items()}
        return {"counts": dict(self.counts), "firings": [asdict(f) for f in self.firings], "history": history}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts = dict(state_dict.get("counts", {}))
        self.firings = [Firing(**f) for f in state_dict.get("firings", [])]
        saved = state_dict.get("history", {})
        if isinstance(saved, list):  # written before issue 56 by an alert of one series (KLAlert, DistillAlert)
            saved = {self.one_series: saved} if saved else {}
        self.history = {name: list(values)[-self.kept() :] for name, values in saved.items() if values}


def below(name: str, value: float | None, threshold: float, advice: str) -> list[Signal]:
    return [Signal(name, value, threshold, "<", advice)] if value is not None and value < threshold else []


def above(name: str, value: float | None, threshold: float, advice: str) -> list[Signal]:
    return [Signal(name, value, threshold, ">", advice)] if value is not None and value > threshold else []
