"""ModeCollapseAlert: completions stop differing, so GRPO stops learning. Reads what training_step returns.

Signals (each must last ``patience`` steps): batch ``reward_std`` under ``min_reward_std``;
``frac_reward_zero_std`` over ``max_frac_zero_std``; within-group distinct completions (exact duplicates)
under ``min_distinct_ratio``; distinct bigrams within groups under ``min_distinct_ngrams``; token entropy
under ``entropy_drop`` times its early value; mean completion length under ``length_drop`` times its early value.

Converged is not collapsed: with ``reward_ceiling`` set, a group whose every completion reached the ceiling
is *solved* and left out of the group signals; a group whose completions are all the same and all wrong is
*stuck* (no gradient can reach it) and counts. No learning signal at all (every group of the batch scored the same)
is ``NoSignalAlert``'s (``callbacks/no_signal.py``), which stops such a run by default; this alert keeps warning.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from typing_extensions import override

from lightning_grpo.callbacks.alerts import Alert, Signal, above, below
from lightning_grpo.types import StepRecord, completion_text, nanstd, zero_std_fraction

# In the order of how often each is the cause: a reward that scores different completions alike, sampling too
# cold for a group to differ, then updates too large.
ADVICE = (
    "check the reward functions can tell completions apart (samples.jsonl: different completions of a prompt "
    "with equal rewards), and set alerts.collapse.reward_ceiling if groups are all correct; then a higher "
    "model.sampling.temperature (0.7-1.0) or double model.num_generations; then halve model.optim.learning_rate, "
    "model.loss.beta 0.04 if it is 0, or model.loss.epsilon_high 0.28"
)


def distinct_ratio(completions: list[Any], group_size: int) -> float:
    """Mean over groups of (distinct completions - 1) / (G - 1): 0 = all identical, 1 = all different.

    >>> distinct_ratio(["7", "7", "7", "7", "1", "2", "3", "4"], group_size=4)
    0.5
    """
    texts = [completion_text(c) for c in completions]
    groups = [texts[i : i + group_size] for i in range(0, len(texts), group_size)]
    return sum((len(set(g)) - 1) / max(len(g) - 1, 1) for g in groups) / len(groups)


def distinct_ngrams(completions: list[Any], group_size: int, n: int = 2) -> float | None:
    """Mean over groups of distinct word n-grams / all word n-grams; ``None`` when no completion has n words
    (one-word answers have no n-gram diversity to lose).

    >>> distinct_ngrams(["a b c", "a b c", "x y z", "p q r"], group_size=2)
    0.75
    """
    texts = [completion_text(c).split() for c in completions]
    ratios = []
    for i in range(0, len(texts), group_size):
        grams = [tuple(w[j : j + n]) for w in texts[i : i + group_size] for j in range(len(w) - n + 1)]
        if grams:
            ratios.append(len(set(grams)) / len(grams))
    return sum(ratios) / len(ratios) if ratios else None


class ModeCollapseAlert(Alert):
    """Warns, stops or raises when a GRPO run collapses, before the remaining steps are wasted.

    Args:
        min_reward_std: batch reward std below this is a collapse signal (practitioners' rule: ~0.1).
        max_frac_zero_std: fraction of groups with identical rewards above this (they carry no gradient).
        min_distinct_ratio: mean over groups of (distinct completions - 1) / (G - 1) below this
            (0 = every group's completions identical).
        min_distinct_ngrams: mean fraction of distinct bigrams within a group below this.
        entropy_drop: entropy below this fraction of its mean over the first ``warmup_steps`` steps.
        length_drop: mean completion length below this fraction of its early mean.
        reward_ceiling: the best reward a completion can get (1.0 for a 0/1 correctness reward), if known;
            groups at the ceiling count as solved, not collapsed.
        warmup_steps: steps that set the early entropy and length; no signal is read before they pass.
        patience: steps in a row a signal lasts before firing.
        action: warn, stop or raise.
    """

    def __init__(
        self,
        min_reward_std: float = 0.1,
        max_frac_zero_std: float = 0.9,
        min_distinct_ratio: float = 0.05,
        min_distinct_ngrams: float = 0.2,
        entropy_drop: float = 0.1,
        length_drop: float = 0.2,
        reward_ceiling: float | None = None,
        warmup_steps: int = 5,
        patience: int = 20,
        action: str = "warn",
    ) -> None:
        super().__init__(patience=patience, action=action)
        self.thresholds = dict(
            min_reward_std=min_reward_std,
            max_frac_zero_std=max_frac_zero_std,
            min_distinct_ratio=min_distinct_ratio,
            min_distinct_ngrams=min_distinct_ngrams,
        )
        self.entropy_drop, self.length_drop, self.warmup_steps = entropy_drop, length_drop, warmup_steps
        self.reward_ceiling = reward_ceiling
        self.early: dict[str, list[float]] = {"entropy": [], "length": []}

    @override
    def settings(self) -> dict[str, Any]:
        return {**super().settings(), **self.thresholds, "reward_ceiling": self.reward_ceiling}

    @override
    def signals(self, trainer: L.Trainer, record: StepRecord) -> list[Signal]:
        rollout = record.rollout
        entropy, length = record.stats.update.entropy, record.stats.lengths.mean
        if len(self.early["length"]) < self.warmup_steps:
            self.early["length"].append(length)
            self.early["entropy"].append(entropy)
            return []
        groups = self.unsolved_groups(record)
        if not groups:
            return []  # every group solved: converged, nothing left to collapse (nothing to learn: NoSignalAlert's)
        t = self.thresholds
        completions = [c for g in groups for c in g["completions"]]
        rewards = torch.stack([g["rewards"] for g in groups])  # [groups, G]
        group_size = rollout.group_size
        found = [
            *below("reward_std", _std(rewards.flatten()), t["min_reward_std"], ADVICE),
            *above("frac_reward_zero_std", zero_std_fraction(rewards), t["max_frac_zero_std"], ADVICE),
            *below("distinct_completions", distinct_ratio(completions, group_size), t["min_distinct_ratio"], ADVICE),
            *below("distinct_ngrams", distinct_ngrams(completions, group_size), t["min_distinct_ngrams"], ADVICE),
            *below("completion_length", length, self.length_drop * _mean(self.early["length"]), ADVICE),
        ]
        found += below("entropy", entropy, self.entropy_drop * _mean(self.early["entropy"]), ADVICE)
        return found

    def unsolved_groups(self, record: StepRecord) -> list[dict[str, Any]]:
        """This rank's groups, less those whose every completion reached ``reward_ceiling``."""
        rollout, total = record.rollout, record.scores.total  # NaN: no function applied (ignored, as the metric)
        g = rollout.group_size
        groups = [
            {"completions": rollout.completions[i : i + g], "rewards": total[i : i + g]}
            for i in range(0, len(rollout), g)
        ]
        if self.reward_ceiling is None:
            return groups
        return [x for x in groups if x["rewards"].nan_to_num(0.0).min().item() < self.reward_ceiling - 1e-6]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "early": {k: list(v) for k, v in self.early.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.early = {k: list(v) for k, v in state_dict.get("early", self.early).items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(x: torch.Tensor) -> float:
    return nanstd(x).nan_to_num(0.0).item()
