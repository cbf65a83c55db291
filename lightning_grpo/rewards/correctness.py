"""Completions + the dataset's ``answer`` column -> correctness scores by text comparison. Runs nothing.

Every function here compares the completion's final answer (the last ``<answer>...</answer>``, else the text
after ``</think>``, else the whole completion; see ``text.answer_text``) with the gold ``answer`` of its row.
A ``None`` gold answer means "not applicable" and scores ``None``. Math equivalence lives in
``math_equivalence.py`` and code execution in ``code_execution.py``. The all-or-nothing ones carry
``is_correctness = True``: their full marks count as ``accuracy`` (``scoring.default_accuracy_reward``).
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import string
from collections.abc import Callable
from typing import Any

from lightning_grpo.rewards.text import answer_text, completion_text

# "1,234.5" is one number (thousands separators), "3,4" is two.
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Most explicit first: "the answer is (B)" beats an earlier "(A) is wrong".
_CHOICE_PATTERNS = [
    re.compile(r"(?i:answer)\s*(?:(?i:is)\s*)?[:\-]?\s*[\*\(\[]*([A-E])\b"),
    re.compile(r"\\boxed\{\s*\(?([A-E])\)?\s*\}"),
    re.compile(r"\*\*\s*\(?([A-E])\)?[.:]?\s*\*\*"),
    re.compile(r"\(([A-E])\)"),
    re.compile(r"^\s*([A-E])\s*[.):]?\s*$"),
]


def _per_row(completions: list[Any], answer: list[Any], score: Callable[[str, Any], float]) -> list[float | None]:
    """``score(final answer text, gold)`` per row; ``None`` where the gold answer is ``None``."""
    return [
        None if gold is None else score(answer_text(completion_text(c)), gold)
        for c, gold in zip(completions, answer, strict=True)
    ]


def normalize(text: str) -> str:
    """Lower-case, drop ASCII punctuation, collapse whitespace: ``" The  Eiffel-Tower! "`` -> ``"the eiffeltower"``."""
    return " ".join(text.lower().translate(_PUNCTUATION).split())


def exact_match_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the stripped final answer equals the stripped gold answer, else 0.0.

    Args:
        completions: [N] plain strings or chat messages.
        answer: [N] gold answers (any type, compared as ``str``); ``None`` scores ``None``.

    >>> exact_match_reward(["7", " 12 ", "7 apples", "<answer>7</answer>"], answer=["7", 12, "7", "7"])
    [1.0, 1.0, 0.0, 1.0]
    >>> exact_match_reward([[{"role": "assistant", "content": "yes"}]], answer=[None])
    [None]
    """
    return _per_row(completions, answer, lambda text, gold: float(text.strip() == str(gold).strip()))


def normalized_match_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the final answer equals the gold answer ignoring case, punctuation and whitespace.

    Args:
        completions: [N] plain strings or chat messages.
        answer: [N] gold answers; ``None`` scores ``None``.

    >>> normalized_match_reward(["  The Eiffel tower.", "Louvre", ""], answer=["the eiffel Tower", "Eiffel", "x"])
    [1.0, 0.0, 0.0]
    """
    return _per_row(completions, answer, lambda text, gold: float(bool(text.strip()) and _same(text, gold)))


def _same(text: str, gold: Any) -> bool:
    return normalize(text) == normalize(str(gold))


def fuzzy_match_reward(threshold: float = 0.8) -> Callable[..., list[float | None]]:
    """A reward giving the difflib similarity ratio of normalised answer and gold, or 0.0 below ``threshold``.

    Graded rather than 0/1 so a near miss ("Eifel Tower") still gives GRPO a signal to climb.

    Args:
        threshold: the smallest similarity in [0, 1] that earns any reward.

    >>> reward = fuzzy_match_reward(threshold=0.8)
    >>> reward(["Eifel Tower", "the Louvre", "eiffel tower!"], answer=["Eiffel Tower", "Eiffel Tower", "Eiffel Tower"])
    [0.9565, 0.0, 1.0]
    """
    return FuzzyMatchReward(threshold)


class FuzzyMatchReward:
    """The callable ``fuzzy_match_reward`` returns; an object rather than a closure so it pickles."""

    __name__ = "fuzzy_match_reward"

    def __init__(self, threshold: float = 0.8) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def __call__(self, completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
        return _per_row(completions, answer, self._score)

    def _score(self, text: str, gold: Any) -> float:
        guess, target = normalize(text), normalize(str(gold))
        ratio = difflib.SequenceMatcher(None, guess, target).ratio() if guess else 0.0
        return round(ratio, 4) if ratio >= self.threshold else 0.0


def _as_number(value: Any) -> float | None:
    """A real number, or the last number written in a string; ``None`` when there is none."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    found = _NUMBER.findall(value) if isinstance(value, str) else []
    return float(found[-1].replace(",", "")) if found else None


def numeric_match_reward(
    completions: list[Any], answer: list[Any], tolerance: float = 1e-6, rel_tolerance: float = 0.0, **kwargs: Any
) -> list[float | None]:
    """1.0 where the last number of the final answer equals the gold number within either tolerance.

    Args:
        completions: [N] plain strings or chat messages.
        answer: [N] gold numbers, or strings whose last number is the gold; ``None`` or no number scores ``None``.
        tolerance: absolute tolerance.
        rel_tolerance: relative tolerance (``0.01`` accepts 1% off), as in ``math.isclose``.

    >>> numeric_match_reward(["so 3+4 is 7", "it is 8", "no number", "1,000 apples"], answer=["7", 7, 7, 1000])
    [1.0, 0.0, 0.0, 1.0]
    >>> numeric_match_reward(["about 99"], answer=["100"], rel_tolerance=0.02), numeric_match_reward(["1"], ["n/a"])
    ([1.0], [None])
    """
    scores: list[float | None] = []
    for c, gold in zip(completions, answer, strict=True):
        target = None if gold is None else _as_number(gold)
        guess = _as_number(answer_text(completion_text(c)))
        if target is None:
            scores.append(None)
            continue
        close = guess is not None and math.isclose(guess, target, rel_tol=rel_tolerance, abs_tol=tolerance)
        scores.append(float(close))
    return scores


def choice_letter(text: str) -> str | None:
    """The option A-E a completion chose ("Answer: B", "\\boxed{B}", "**B**", "(B)", a bare "B"), else ``None``.

    >>> [choice_letter(t) for t in ["(A) is wrong, so the answer is (C)", "**D**", "I pick (b)", "E"]]
    ['C', 'D', None, 'E']
    """
    for pattern in _CHOICE_PATTERNS:
        found = pattern.findall(text)
        if found:
            return found[-1]
    return None


def multiple_choice_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 where the option letter the completion chose equals the gold letter.

    Args:
        completions: [N] plain strings or chat messages.
        answer: [N] gold letters ("B", "b", "(B)"); ``None`` or a non-letter scores ``None``.

    >>> multiple_choice_reward(["Answer: B", "The answer is **C**", "no idea"], answer=["B", "(b)", "A"])
    [1.0, 0.0, 0.0]
    """
    golds = [choice_letter(g.strip().upper()) if isinstance(g, str) else None for g in answer]
    return _per_row(completions, golds, lambda text, gold: float(choice_letter(text) == gold))


def rouge_l_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """ROUGE-L F1 between the final answer's words and the gold reference's (normalised), in [0, 1]: torchmetrics'
    ``rouge_score`` on the words of ``normalize`` (its own tokenizer would drop every non-ASCII letter).

    Args:
        completions: [N] plain strings or chat messages, e.g. summaries.
        answer: [N] reference texts; ``None`` scores ``None``.

    >>> rouge_l_reward(["the cat sat on the mat", ""], answer=["a cat sat on a mat", "x"])
    [0.6667, 0.0]
    """
    from torchmetrics.functional.text.rouge import rouge_score  # loads nltk's helpers: only when scoring

    def score(text: str, gold: Any) -> float:
        guess, reference = normalize(text), normalize(str(gold))
        if not guess or not reference:
            return 0.0
        f1 = rouge_score(guess, reference, rouge_keys="rougeL", normalizer=_as_is, tokenizer=str.split)
        return round(f1["rougeL_fmeasure"].item(), 4)

    return _per_row(completions, answer, score)


def _as_is(text: str) -> str:
    return text


for _fn in (exact_match_reward, normalized_match_reward, numeric_match_reward, multiple_choice_reward):
    _fn.is_correctness = True
