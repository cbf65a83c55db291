"""KLAlert: the policy runs away from the reference or from the policy that sampled.

Signals: ``kl`` over ``max_kl`` (practitioners' rule: past ~0.5 the run is diverging); ``kl`` growing more
than ``max_kl_growth`` times within ``window`` steps (from a KL of at least ``min_kl``); clipped-token fraction
``clip_ratio/region_mean`` over ``max_clip_ratio`` (the update leaves the trust region too often).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal, above
from lightning_grpo.types import StepRecord

# Halving the learning rate first: on the tiny model (tests/callbacks/test_alerts.py) 1e-2 fires and 5e-3 keeps KL
# under 0.45 for 30 steps, while doubling beta at 1e-2 still fires (the KL term pulls back slower than the step
# pushes out).
KL_ADVICE = (
    "halve model.optim.learning_rate (and again if it fires again), then double model.loss.beta (0.04 -> 0.08), "
    "and model.update.num_iterations 1"
)
CLIP_ADVICE = (
    "halve model.optim.learning_rate, or halve model.update.num_iterations (at 1 nothing is clipped); a larger "
    "epsilon only hides the problem"
)


class KLAlert(Alert):
    """Warns, stops or raises when KL or the clipped fraction says the policy is diverging.

    Args:
        max_kl: KL to the reference above this is a divergence signal (needs beta > 0 to be measured).
        max_kl_growth: KL now over this multiple of KL ``window`` steps ago is a signal.
        min_kl: growth is only judged from a past KL of at least this (ratios of tiny numbers mean nothing).
        max_clip_ratio: fraction of tokens outside the clip range above this is a signal.
        window: steps over which growth is measured.
        patience: steps in a row a signal lasts before firing.
        action: warn, stop or raise.
    """

    one_series = "kl"

    def __init__(
        self,
        max_kl: float = 0.5,
        max_kl_growth: float = 4.0,
        min_kl: float = 0.05,
        max_clip_ratio: float = 0.2,
        window: int = 10,
        patience: int = 3,
        action: str = "warn",
    ) -> None:
        super().__init__(patience=patience, action=action, window=window)
        self.max_kl, self.max_kl_growth, self.min_kl = max_kl, max_kl_growth, min_kl
        self.max_clip_ratio = max_clip_ratio

    @override
    def settings(self) -> dict[str, Any]:
        limits = (self.max_kl, self.max_kl_growth, self.min_kl, self.max_clip_ratio, self.window)
        return {**super().settings(), "limits": limits}

    @override
    def kept(self) -> int:
        return self.window + 1  # the KL ``window`` steps ago and every one since

    @override
    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        update = record.stats.update
        found = above("clip_ratio/region_mean", update.clip_region, self.max_clip_ratio, CLIP_ADVICE)
        kl = update.kl
        if kl is None:
            return found
        series = self.remember("kl", kl)
        found += above("kl", kl, self.max_kl, KL_ADVICE)
        past = series[0]
        if len(series) > self.window and past >= self.min_kl:  # ratios of near-zero KL mean nothing
            found += above("kl_growth", kl / past, self.max_kl_growth, KL_ADVICE)
        return found
