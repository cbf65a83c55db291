"""Per-token entropies -> which tokens to train on and how much entropy bonus to give. No model, no trainer.

- ``top_entropy_quantile`` ("Beyond the 80/20 rule", arXiv:2506.01939): train only on the highest-entropy
  tokens, the "forking" tokens where the policy decides; TRL 1.16's quantile semantics (``get_high_entropy_mask``).
- ``EntropyController``: the entropy bonus weight, fixed or adapted each optimiser step as Skywork-OR1
  (arXiv:2505.22312) and TRL 1.16 do; its state is saved with the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor


def entropy_threshold(entropies: Tensor, mask: Tensor, top_entropy_quantile: float) -> Tensor:
    """Scalar entropy at the ``1 - top_entropy_quantile`` quantile of the masked tokens (linear interpolation).

    Give it the entropies of the whole batch (all ranks, padding dropped) for one threshold per step;
    TRL computes it per micro-batch, over the micro-batch gathered from all ranks.

    >>> entropy_threshold(torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]]), torch.ones(1, 5), 0.25)  # 75th percentile
    tensor(3.)
    """
    values = entropies[mask.bool()].float()  # [active tokens]
    if values.numel() == 0:
        return torch.tensor(float("inf"), device=entropies.device)  # no token is kept
    return torch.quantile(values, 1 - top_entropy_quantile)


def high_entropy_mask(
    entropies: Tensor, mask: Tensor, top_entropy_quantile: float, threshold: Tensor | None = None
) -> Tensor:
    """[n, T] 1 on masked tokens whose entropy is at least the threshold (ties kept), 0 elsewhere.

    ``top_entropy_quantile`` 0.2 keeps the top 20%; 0.0 keeps only the highest (and its ties); 1.0 keeps all.
    ``threshold`` defaults to ``entropy_threshold`` of these entropies.
    """
    if threshold is None:
        threshold = entropy_threshold(entropies, mask, top_entropy_quantile)
    return ((entropies.detach() * mask >= threshold) & mask.bool()).to(mask.dtype)


@dataclass
class EntropyController:
    """The entropy bonus weight, as TRL 1.16's ``entropy_coef`` / ``use_adaptive_entropy`` handle it.

    Fixed: ``coef`` always. Adaptive: the coefficient applies only while the last measured entropy is at or below
    ``target`` (none before the first measurement); after each optimiser step it moves by ``delta`` towards more
    bonus when the step's entropy was at or below ``target`` and towards less otherwise, within [min, max].

    Use: ``coef_to_apply()`` for every micro-batch of a step, ``observe`` each micro-batch's trained-token
    entropy sum and count (``LossOutput.trained_entropy``, ``.trained_tokens``), ``update`` once per optimiser step
    (after the last micro-batch) with a sum across ranks.
    """

    coef: float = 0.0
    adaptive: bool = False
    coef_min: float = 0.0
    coef_max: float = 1.0
    coef_delta: float = 0.005
    target: float = 0.2
    last_entropy: float = float("inf")
    window_sum: float = 0.0  # entropy summed over the trained tokens of this step's micro-batches so far
    window_tokens: float = 0.0

    @classmethod
    def from_config(cls, c: Any) -> EntropyController:
        """From a ``LossConfig``'s entropy options."""
        return cls(
            c.entropy_coef,
            c.use_adaptive_entropy,
            c.entropy_coef_min,
            c.entropy_coef_max,
            c.entropy_coef_delta,
            c.entropy_target,
        )

    @property
    def enabled(self) -> bool:
        """Whether the loss has an entropy bonus at all (adaptive stays enabled at coef 0 so it can recover)."""
        return self.coef != 0.0 or self.adaptive

    def metrics(self) -> dict[str, float]:
        """``entropy_coef``, the bonus weight now, when there is a bonus."""
        return {"entropy_coef": self.coef} if self.enabled else {}

    def coef_to_apply(self) -> float:
        """The weight of the entropy bonus for this step's micro-batches."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def observe(self, entropy_sum: float | Tensor, tokens: float | Tensor) -> None:
        """Add one micro-batch's entropy summed over its trained tokens, and their count, to this step's window."""
        if self.adaptive:
            self.window_sum += float(entropy_sum)
            self.window_tokens += float(tokens)

    def update(self, all_reduce_sum: Callable[[Tensor], Tensor] = lambda t: t) -> None:
        """End of an optimiser step: measure the window's entropy (summed over ranks) and move the coefficient."""
        if not self.adaptive:
            return
        totals = all_reduce_sum(torch.tensor([self.window_sum, self.window_tokens], dtype=torch.float64))
        entropy = float(totals[0] / totals[1].clamp(min=1.0))
        if entropy <= self.target:
            self.coef = min(self.coef + self.coef_delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.coef_delta, self.coef_min)
        self.last_entropy = entropy
        self.window_sum = self.window_tokens = 0.0

    def state_dict(self) -> dict[str, float | bool]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, float | bool]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
