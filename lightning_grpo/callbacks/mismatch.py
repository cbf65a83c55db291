"""MismatchAlert: the engine that samples (vLLM) and the trainer disagree on the probabilities of the tokens.

Signals, over the loss tokens of the global batch (``StepStats.mismatch``, present when another engine sampled and
``update.sampling_correction`` is on):
- ``token_mult_prob_error`` over ``max_token_mult_prob_error`` (1.1): NeMo-RL's nightly runs fail when its median
  passes 1.1 (tokens' probabilities off by ~10% on average);
- ``sampler_kl``: ``sampling/kl`` (k3 KL(sampler || trainer)) over ``max_kl`` (0.01): NeMo-RL's runs gate their
  ``gen_kl_error`` mean under 0.01;
- ``sampler_ess``: ``sampling/ess/token``, the normalised effective sample size of the token ratios, under
  ``min_ess`` (0.5): the re-weighted batch carries less than half its tokens' information, a few tokens dominate
  the correction (not watched with ``bypass``, which applies no weight).
Under the first two, uncorrected training degrades (NeMo-RL #1330, the "When Speed Kills Stability" study); under
the third, the correction's variance does. With a sampler behind by design (``AsyncRollouts``), the gap includes
the policy's own movement since it sampled, and the advice says so, with amounts: the learning rate and the
staleness to lower them to.

Each signal is judged on the median of its last ``window`` steps, not on one step: under async a single update that
moves the policy far makes a one-step spike, which is no fault to act on; a mismatch at least half the window long
moves the median.
"""

from __future__ import annotations

import statistics
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal, above, below
from lightning_grpo.types import StepRecord

ADVICE = (
    "check that the sampler's weights are synced after each optimiser step and that both engines run the same "
    "dtype (fp32 or bf16 on both; vLLM's fp8/quantised KV caches raise it); keep update.sampling_correction on "
    "(icepop or sequence_mask are the robust choices)"
)
ESS_ADVICE = "a masking correction (icepop, sequence_mask) rather than truncation, or fix the mismatch at its source"
STALE_ADVICE = (
    "the sampler is up to {k} update(s) behind (AsyncRollouts max_staleness), so this gap is mostly the policy's own "
    "movement since it sampled, not an engine fault: {remedy}"
)
REMEDIES = {  # by MismatchStats.anchored (update.sampling_correction: bypass), under a sampler behind by design
    True: "the loss already clips its ratio against the sampler (bypass); if the reward stalls, {lower}",
    False: "{lower}, or anchor the clip at the sampler (update.sampling_correction: bypass, the default under async)",
}


def lower_by(learning_rate: float | None, staleness: int) -> str:
    """The amounts to try under a sampler ``staleness`` updates behind: half the learning rate, one update less.

    >>> lower_by(1e-3, 2)
    'halve model.optim.learning_rate (0.001 -> 0.0005), or lower max_staleness (2 -> 1)'
    >>> lower_by(None, 1)
    'halve model.optim.learning_rate, or lower max_staleness (1 -> 0: synchronous)'
    """
    rate = f" ({learning_rate:.4g} -> {learning_rate / 2:.4g})" if learning_rate else ""
    fewer = f"{staleness} -> {staleness - 1}" + (": synchronous" if staleness == 1 else "")
    return f"halve model.optim.learning_rate{rate}, or lower max_staleness ({fewer})"


def base_learning_rate(trainer: L.Trainer) -> float | None:
    """The optimiser's configured learning rate (a scheduler's ``initial_lr``), None without an optimiser."""
    groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
    return groups[0].get("initial_lr", groups[0]["lr"]) if groups else None


class MismatchAlert(Alert):
    """Warns, stops or raises when the sampler's and the trainer's log-probs of the sampled tokens drift apart.

    Nothing to observe when the policy samples itself (HFGenerate, LeanDecode): the alert then stays silent. With
    ``update.sampling_correction: null`` the mismatch is still measured and watched (nothing re-weights it).

    Args:
        max_token_mult_prob_error: mean ``exp(|trainer logp - sampler logp|)`` per token above this is a signal
            (1 when the engines agree; NeMo-RL's CI bound is 1.1).
        max_kl: KL(sampler || trainer), k3 estimator per token, above this is a signal.
        min_ess: normalised effective sample size of the token ratios, in (0, 1], below this is a signal.
        window: each signal is judged on the median of its last ``window`` steps (fewer at the start): one step
            off does not move it, half the window off does.
        patience: steps in a row a signal's median lasts past its limit before firing.
        action: warn, stop or raise.

    Example::

        import lightning as L
        from lightning_grpo.callbacks import MismatchAlert

        trainer = L.Trainer(callbacks=[MismatchAlert(max_kl=0.005, action="stop")], max_steps=0, logger=False)
    """

    def __init__(
        self,
        max_token_mult_prob_error: float = 1.1,
        max_kl: float = 0.01,
        min_ess: float = 0.5,
        window: int = 5,
        patience: int = 3,
        action: str = "warn",
    ) -> None:
        super().__init__(patience=patience, action=action, window=window)
        if max_token_mult_prob_error < 1:
            raise ValueError(f"max_token_mult_prob_error must be >= 1 (1: agreement), got {max_token_mult_prob_error}")
        if max_kl < 0:
            raise ValueError(f"max_kl must be >= 0, got {max_kl}")
        if not 0 <= min_ess <= 1:
            raise ValueError(f"min_ess must be in [0, 1], got {min_ess}")
        self.max_token_mult_prob_error, self.max_kl, self.min_ess = max_token_mult_prob_error, max_kl, min_ess

    @override
    def settings(self) -> dict[str, Any]:
        limits = (self.max_token_mult_prob_error, self.max_kl, self.min_ess, self.window)
        return {**super().settings(), "limits": limits}

    def median(self, name: str, value: float | None) -> float | None:
        """The median of ``name``'s last ``window`` values, this step's ``value`` included (None: not measured)."""
        return None if value is None else statistics.median(self.remember(name, value))

    @override
    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        m = record.stats.mismatch
        if m is None:
            return []
        stale = int(record.stats.extra.get("async/staleness/max", 0))  # a sampler behind by design
        advice = self.advice(trainer, stale, m.anchored)
        error = self.median("token_mult_prob_error", m.token_mult_prob_error)
        found = above("token_mult_prob_error", error, self.max_token_mult_prob_error, advice)
        found += above("sampler_kl", self.median("sampler_kl", m.kl), self.max_kl, advice)
        if not m.anchored:  # bypass weights nothing, so the ratios' effective sample size is no correction's variance
            found += below("sampler_ess", self.median("sampler_ess", m.ess_token), self.min_ess, ESS_ADVICE)
        for signal in found:
            signal.diagnosis = f"the median of the last {len(self.history[signal.name])} steps"
        return found

    @staticmethod
    def advice(trainer: L.Trainer, stale: int, anchored: bool) -> str:
        if not stale:
            return ADVICE
        remedy = REMEDIES[anchored].format(lower=lower_by(base_learning_rate(trainer), stale))
        return STALE_ADVICE.format(k=stale, remedy=remedy)
