"""Completion text -> style rewards: n-gram repetition penalty, visible reasoning steps, citations.

Heuristics on the surface of the text; none of them knows whether the content is right, so weight them
below a correctness reward or the policy learns to look careful instead of being right.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lightning_grpo.rewards.text import completion_text

_STEP_MARKERS = re.compile(
    r"(?i:\bstep\s*\d+\b)"  # "Step 1:", "step 2"
    r"|^\s*\d+[.)]\s"  # a numbered list item "1. ", "2) "
    r"|\b(?:First|Second|Third|Then|Next|Finally|Lastly)\b",  # capitalised only: it starts a sentence
    re.MULTILINE,
)
_CITATIONS = re.compile(
    r"\[\d+(?:\s*[,\-\u2013]\s*\d+)*\]"  # [1], [2, 3], [4-6]
    r"|\([A-Z][\w'\-]+(?: et al\.| (?:and|&) [A-Z][\w'\-]+)?,? \d{4}[a-z]?\)"  # (Smith, 2020), (Li et al., 2021)
    r"|https?://[^\s)\]]+"  # a URL
)
STEPS_FOR_FULL_CREDIT = 3


def _ngrams(units: list[Any], n: int) -> list[tuple[Any, ...]]:
    return list(zip(*[units[i:] for i in range(n)]))


def repetition_penalty(n: int = 3, max_penalty: float = 1.0, unit: str = "words") -> Callable[..., list[float | None]]:
    """A penalty ``-max_penalty * (1 - distinct n-grams / total n-grams)``: 0.0 without repeats.

    Discourages the degenerate loops a policy falls into under length or format shaping. Completions
    shorter than ``n`` units score 0.0.

    Args:
        n: n-gram size.
        max_penalty: the penalty's magnitude (>= 0) as the repeated fraction approaches 1.
        unit: ``words`` (lower-cased, whitespace-split text) or ``tokens`` (``completion_ids``, as TRL's
            ``get_repetition_penalty_reward``).

    >>> penalty = repetition_penalty(n=2, max_penalty=1.0)
    >>> penalty(["the cat sat on the mat", "go go go go go", "hi"])
    [0.0, -0.75, 0.0]
    """
    return RepetitionPenalty(n, max_penalty, unit)


class RepetitionPenalty:
    """The callable ``repetition_penalty`` returns."""

    __name__ = "repetition_penalty_reward"
    UNITS = ("words", "tokens")

    def __init__(self, n: int = 3, max_penalty: float = 1.0, unit: str = "words") -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if max_penalty < 0:
            raise ValueError(f"max_penalty must be >= 0 (the score is -max_penalty * repeated), got {max_penalty}")
        if unit not in self.UNITS:
            raise ValueError(f"unit must be one of {list(self.UNITS)}, got {unit!r}")
        self.n, self.max_penalty, self.unit = n, max_penalty, unit

    def __call__(
        self, completions: list[Any], completion_ids: list[list[int]] | None = None, **kwargs: Any
    ) -> list[float | None]:
        if self.unit == "tokens" and completion_ids is None:
            raise ValueError("unit='tokens' needs completion_ids; pass them or use unit='words'")
        if self.unit == "tokens":
            sequences = [list(ids) for ids in completion_ids]
        else:
            sequences = [completion_text(c).lower().split() for c in completions]
        return [self._penalty(_ngrams(units, self.n)) for units in sequences]

    def _penalty(self, grams: list[tuple[Any, ...]]) -> float:
        if not grams:
            return 0.0
        repeated = 1.0 - len(set(grams)) / len(grams)
        return round(-self.max_penalty * repeated, 4) if repeated else 0.0


def reasoning_steps_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Share of 3 visible reasoning steps: "Step 1", numbered list items, "First/Then/Next/Finally" markers.

    ``min(1, markers / 3)``, as open-r1's ``reasoning_steps_reward``; capped so listing 30 steps earns no
    more than 3.

    >>> reasoning_steps_reward(["Step 1: add. Step 2: halve. Finally, round.", "1. a\\n2. b", "It is 4.", ""])
    [1.0, 0.6667, 0.0, 0.0]
    """
    scores: list[float | None] = []
    for c in completions:
        count = len(_STEP_MARKERS.findall(completion_text(c)))
        scores.append(round(min(1.0, count / STEPS_FOR_FULL_CREDIT), 4))
    return scores


def citation_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the completion cites a source: ``[1]``, ``(Author, 2020)``, ``(Li et al., 2021)`` or a URL.

    >>> citation_reward(["As shown in [2].", "(Vaswani et al., 2017) introduced it.", "See https://arxiv.org", "No."])
    [1.0, 1.0, 1.0, 0.0]
    """
    return [float(bool(_CITATIONS.search(completion_text(c)))) for c in completions]
