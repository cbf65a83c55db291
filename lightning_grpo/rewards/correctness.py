"""Correctness rewards: does the completion's answer match the dataset's ``answer`` column."""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def completion_text(completion: Any) -> str:
    """Text of a plain-text completion or of a chat completion ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, list):
        completion = completion[-1].get("content", "") if completion else ""
    return completion if isinstance(completion, str) else ""


def exact_match_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the stripped completion equals the stripped answer, else 0.0; None where the answer is None.

    >>> exact_match_reward(["7", " 12 ", "7 apples"], answer=["7", 12, "7"])
    [1.0, 1.0, 0.0]
    >>> exact_match_reward([[{"role": "assistant", "content": "yes"}]], answer=[None])
    [None]
    """
    return [
        None if gold is None else float(completion_text(c).strip() == str(gold).strip())
        for c, gold in zip(completions, answer, strict=True)
    ]


def numeric_match_reward(
    completions: list[Any], answer: list[Any], tolerance: float = 1e-6, **kwargs: Any
) -> list[float | None]:
    """1.0 where the last number in the completion equals the numeric answer within ``tolerance``.

    >>> numeric_match_reward(["so 3+4 is 7", "it is 8", "no number"], answer=["7", 7, 7])
    [1.0, 0.0, 0.0]
    """
    scores: list[float | None] = []
    for c, gold in zip(completions, answer, strict=True):
        numbers = _NUMBER.findall(completion_text(c))
        if gold is None:
            scores.append(None)
            continue
        scores.append(float(bool(numbers) and abs(float(numbers[-1]) - float(gold)) <= tolerance))
    return scores
