"""UnscoredRewardAlert: a reward function that returns NaN or None for (nearly) every completion, named.

None (and NaN) mean "not applicable" to the scoring: the row's other functions decide its reward, and a row no
function scores has reward NaN. A function that scores no completion for steps on end is almost always a bug (a
column name that does not match, a parser that never finds the answer, an exception turned into None), and the
run goes on at ``reward=nan`` or on the other functions alone; the generic collapse alert fires much later and
names neither the function nor NaN. This alert names the function and the step since which it has not scored.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal
from lightning_grpo.types import StepRecord

ADVICE = (
    "check the function with a few completions from samples.jsonl: the dataset columns it reads (their names), "
    "the answer format it parses, and exceptions it turns into None"
)


class UnscoredRewardAlert(Alert):
    """Warns, stops or raises when a reward function leaves a step's completions unscored (NaN or None).

    It fires when at least ``min_fraction`` of a step's completions are unscored, ``patience`` steps in a row.

    Args:
        min_fraction: fraction of a step's completions (on a rank) a function leaves unscored (NaN or None)
            for the step to count; 1.0: all of them.
        patience: steps in a row a signal lasts before firing.
        action: warn, stop or raise.

    Example::

        trainer = L.Trainer(callbacks=[UnscoredRewardAlert(patience=2, action="stop")])
    """

    def __init__(self, min_fraction: float = 1.0, patience: int = 3, action: str = "warn") -> None:
        super().__init__(patience=patience, action=action)
        if not 0 < min_fraction <= 1:
            raise ValueError(f"min_fraction must be in (0, 1], got {min_fraction}")
        self.min_fraction = min_fraction

    @override
    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "min_fraction": self.min_fraction}

    @override
    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        scores = record.scores
        unscored = scores.per_function.isnan().float().mean(dim=0)  # [F] fraction of completions
        found = []
        for name, fraction in zip(scores.names, unscored.tolist()):
            if fraction >= self.min_fraction:
                since = trainer.global_step - self.counts.get(f"unscored/{name}", 0)
                diagnosis = f"reward function {name!r} returns NaN or None, since step {since}"
                found.append(Signal(f"unscored/{name}", fraction, self.min_fraction, ">=", ADVICE, diagnosis))
        return found
