"""DistillAlert: the student has stopped getting closer to its teacher.

Signal, from ``StepStats.distill`` (present with a ``distill.teacher``): the mean of ``train/distill/reverse_kl`` over
the last ``window`` steps has not fallen below its mean over the ``window`` steps before by more than ``min_delta``
nats. The per-step value is a one-sample estimate on the student's own completions, so single steps are noisy;
two window means are not. A plateau far above 0 means the student has learnt what this signal can teach it: it is
too small to imitate the teacher further, the learning rate is off, or the teacher itself is unsure on these
prompts (``train/distill/top_agreement`` under gkd, the teacher's accuracy).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal
from lightning_grpo.types import StepRecord

ADVICE = (
    "try another learning rate (lower if train/distill/reverse_kl oscillates, higher if it creeps), check the "
    "teacher on these prompts, mix the rewards in (distill.reward_weight > 0), or stop: the student may be too "
    "small to imitate the teacher further"
)


class DistillAlert(Alert):
    """Warns, stops or raises when the student's reverse KL to its teacher stops falling.

    Silent in runs without a teacher. Compares the mean ``train/distill/reverse_kl`` of the last ``window`` steps
    with that of the ``window`` steps before them.

    Args:
        window: steps per mean; the first signal can come after ``2 * window`` steps.
        min_delta: nats; the later mean must be lower than the earlier one by more than this.
        patience: steps in a row the plateau lasts before firing.
        action: warn, stop or raise.

    Example::

        import lightning as L
        from lightning_grpo.callbacks import DistillAlert

        alert = DistillAlert(window=20, min_delta=0.01, action="stop")
        trainer = L.Trainer(callbacks=[alert], max_steps=0, logger=False)
    """

    one_series = "distill_reverse_kl"

    def __init__(self, window: int = 20, min_delta: float = 0.0, patience: int = 1, action: str = "warn") -> None:
        super().__init__(patience=patience, action=action, window=window)
        if min_delta < 0:
            raise ValueError(f"min_delta must be >= 0 (nats), got {min_delta}")
        self.min_delta = min_delta

    @override
    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "window": self.window, "min_delta": self.min_delta}

    @override
    def kept(self) -> int:
        return 2 * self.window  # the window before and the last one

    @override
    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        d = record.stats.distill
        if d is None or d.tokens == 0:
            return []
        series = self.remember("distill_reverse_kl", d.reverse_kl)
        if len(series) < 2 * self.window:
            return []
        before = sum(series[: self.window]) / self.window
        recent = sum(series[self.window :]) / self.window
        if before - recent > self.min_delta:
            return []
        diagnosis = f"the student's reverse KL to its teacher averaged {before:.4g} over the {self.window} steps before"
        return [Signal("distill_reverse_kl", recent, before - self.min_delta, ">=", ADVICE, diagnosis)]
