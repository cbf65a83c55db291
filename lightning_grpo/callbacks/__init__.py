"""Callbacks that observe a GRPO run: they log, warn, or stop the trainer; they never change the math."""

from lightning_grpo.callbacks.export import HFExport
from lightning_grpo.callbacks.summary import RunSummary

__all__ = ["HFExport", "RunSummary"]
