"""RunSummary: held-out accuracy and reward before -> after, steps and wall time, printed and saved.

"Before" is the validation pass Lightning runs as its sanity check (set ``num_sanity_val_steps: -1`` so it
covers the whole validation set); "after" is the last validation pass of the run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from lightning_grpo.run import run_dir

TRACKED = ("val/accuracy", "val/reward")


class RunSummary(L.Callback):
    """Writes ``summary.json`` into the run's log directory at the end of ``fit`` and prints it.

    Args:
        filename: name of the summary file inside the trainer's log directory.
    """

    def __init__(self, filename: str = "summary.json") -> None:
        self.filename = filename
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.started = 0.0
        self.earlier = 0.0  # seconds trained before a resume: the summary covers the whole run
        self.path: Path | None = None

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = time.time()

    def _read(self, trainer: L.Trainer) -> dict[str, float]:
        return {k: float(trainer.callback_metrics[k]) for k in TRACKED if k in trainer.callback_metrics}

    @override
    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.before = self._read(trainer)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.after = self._read(trainer)

    def summary(self, trainer: L.Trainer) -> dict[str, Any]:
        out: dict[str, Any] = {
            "steps": trainer.global_step,
            "wall_time_s": round(self._elapsed(), 1),
        }
        for key in TRACKED:
            name = key.split("/", 1)[1]
            out[f"{name}_before"] = self.before.get(key)
            out[f"{name}_after"] = self.after.get(key)
        return out

    @override
    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        summary = self.summary(trainer)
        self.path = run_dir(trainer) / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(summary, indent=2) + "\n")
        print(format_summary(summary) + f"\nsummary written to {self.path}")

    def _elapsed(self) -> float:
        return self.earlier + (time.time() - self.started if self.started else 0.0)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after, "elapsed": self._elapsed()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.before = state_dict.get("before", {})
        self.after = state_dict.get("after", {})
        self.earlier = state_dict.get("elapsed", 0.0)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def format_summary(s: dict[str, Any]) -> str:
    return (
        f"GRPO run: {s['steps']} steps in {s['wall_time_s']}s | "
        f"held-out accuracy {_pct(s['accuracy_before'])} -> {_pct(s['accuracy_after'])} | "
        f"mean reward {_num(s['reward_before'])} -> {_num(s['reward_after'])}"
    )
