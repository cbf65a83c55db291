"""Callbacks that observe a GRPO run: they log, warn, or stop the trainer; they never change the math."""

from lightning_grpo.callbacks.alert_set import Alerts
from lightning_grpo.callbacks.alerts import Alert, GRPOAlertError
from lightning_grpo.callbacks.collapse import ModeCollapseAlert
from lightning_grpo.callbacks.distill import DistillAlert
from lightning_grpo.callbacks.divergence import KLAlert
from lightning_grpo.callbacks.early_stopping import StepEarlyStopping
from lightning_grpo.callbacks.export import HFExport
from lightning_grpo.callbacks.faults import FaultCheckpoint
from lightning_grpo.callbacks.final import ValidateAtEnd
from lightning_grpo.callbacks.metricsfile import MetricsFile
from lightning_grpo.callbacks.mismatch import MismatchAlert
from lightning_grpo.callbacks.monitor import RewardMonitor
from lightning_grpo.callbacks.no_signal import NoSignalAlert
from lightning_grpo.callbacks.preemption import PreemptionCheckpoint
from lightning_grpo.callbacks.samples import CompletionSampleLogger
from lightning_grpo.callbacks.summary import RunSummary
from lightning_grpo.callbacks.tool_use import ToolUseAlert
from lightning_grpo.callbacks.unscored import UnscoredRewardAlert

__all__ = [
    "Alert",
    "Alerts",
    "CompletionSampleLogger",
    "DistillAlert",
    "FaultCheckpoint",
    "GRPOAlertError",
    "HFExport",
    "KLAlert",
    "MetricsFile",
    "MismatchAlert",
    "ModeCollapseAlert",
    "NoSignalAlert",
    "PreemptionCheckpoint",
    "RewardMonitor",
    "RunSummary",
    "StepEarlyStopping",
    "UnscoredRewardAlert",
    "ToolUseAlert",
    "ValidateAtEnd",
]
