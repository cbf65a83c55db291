"""Alerts: the CLI's ``alerts:`` section, the seven run alerts that are on by default, each settable or turned off.

::

    alerts:
      signal: {patience: 50}          # NoSignalAlert's settings; the others keep theirs
      collapse: {patience: 30}
      kl: {max_kl: 1.0, action: stop}
      tools: null                     # off

``--alerts.kl.max_kl 1.0`` sets one on the command line; ``--alerts.kl.help KLAlert`` lists an alert's settings,
``--print_config`` shows them all with their values. In Python, put the alert callbacks in ``Trainer(callbacks=...)``
directly. Each alert used to be a section of its own (``kl_alert:``); ``MOVED`` names where each went, and the
CLI's error for an old section says it.
"""

from __future__ import annotations

from jsonargparse import lazy_instance

from lightning_grpo.callbacks.alerts import Alert
from lightning_grpo.callbacks.collapse import ModeCollapseAlert
from lightning_grpo.callbacks.distill import DistillAlert
from lightning_grpo.callbacks.divergence import KLAlert
from lightning_grpo.callbacks.mismatch import MismatchAlert
from lightning_grpo.callbacks.no_signal import NoSignalAlert
from lightning_grpo.callbacks.tool_use import ToolUseAlert
from lightning_grpo.callbacks.unscored import UnscoredRewardAlert

# the sections each alert had of its own -> its place now
MOVED = {
    "collapse_alert": "alerts.collapse",
    "kl_alert": "alerts.kl",
    "mismatch_alert": "alerts.mismatch",
    "unscored_alert": "alerts.unscored",
    "tool_alert": "alerts.tools",
}

ALERTS = {
    "signal": NoSignalAlert,
    "collapse": ModeCollapseAlert,
    "kl": KLAlert,
    "mismatch": MismatchAlert,
    "unscored": UnscoredRewardAlert,
    "tools": ToolUseAlert,
    "distill": DistillAlert,
}
ON = {name: lazy_instance(alert) for name, alert in ALERTS.items()}  # the defaults, as --print_config shows them


class Alerts:
    """The run's alerts, each on unless set to null (`--alerts.kl.help KLAlert` lists one's settings).

    Each warns, stops (after saving ``checkpoints/last.ckpt``) or raises when its signal lasts ``patience`` steps.

    Args:
        signal: no group's rewards differ, so nothing is learnt (``NoSignalAlert``: stops the run by default,
            naming the cause, a completion beside its expected answer, and what to change).
        collapse: mode collapse (``ModeCollapseAlert``: reward std, identical groups, entropy and length drops).
        kl: divergence from the reference (``KLAlert``: KL level and growth, the clipped fraction).
        mismatch: the sampler's and the trainer's log-probs of the sampled tokens drift apart (``MismatchAlert``).
        unscored: a reward function leaves a step's completions unscored, NaN or None (``UnscoredRewardAlert``).
        tools: the configured tools are never called, or their calls cannot be read (``ToolUseAlert``).
        distill: the student stops getting closer to its teacher (``DistillAlert``; silent without a teacher).
    """

    def __init__(
        self,
        signal: NoSignalAlert | None = ON["signal"],
        collapse: ModeCollapseAlert | None = ON["collapse"],
        kl: KLAlert | None = ON["kl"],
        mismatch: MismatchAlert | None = ON["mismatch"],
        unscored: UnscoredRewardAlert | None = ON["unscored"],
        tools: ToolUseAlert | None = ON["tools"],
        distill: DistillAlert | None = ON["distill"],
    ) -> None:
        given = {
            "signal": signal,
            "collapse": collapse,
            "kl": kl,
            "mismatch": mismatch,
            "unscored": unscored,
            "tools": tools,
            "distill": distill,
        }
        # a default is one object for every call (the CLI builds its own from the config): each Alerts() its own alerts
        self.alerts = [
            ALERTS[name]() if alert is ON[name] else alert for name, alert in given.items() if alert is not None
        ]

    def callbacks(self) -> list[Alert]:
        """The alerts that are on, for ``Trainer(callbacks=...)``."""
        return list(self.alerts)
