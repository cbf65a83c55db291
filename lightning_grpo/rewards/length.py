"""Completion lengths -> length-shaping rewards: an ideal length, hard bounds, DAPO's soft overlong punishment.

Lengths are counted in ``tokens`` (from ``completion_ids``, what the sampler's ``max_completion_length``
counts), ``words`` or ``chars`` of the completion text. Factories return small callable objects rather than
closures so they pickle (spawned DDP workers, multiprocessing) and carry a ``__name__`` for the metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lightning_grpo.rewards.text import completion_text

LENGTH_UNITS: dict[str, Callable[[str, list[int]], int]] = {
    "tokens": lambda text, ids: len(ids),
    "words": lambda text, ids: len(text.split()),
    "chars": lambda text, ids: len(text),
}
# Reward in [0, 1] from the distance to the target in units of ``width``.
FALLOFFS: dict[str, Callable[[float], float]] = {
    "linear": lambda d: max(0.0, 1.0 - d),
    "gaussian": lambda d: math.exp(-0.5 * d * d),
}


def _check_unit(unit: str) -> None:
    if unit not in LENGTH_UNITS:
        raise ValueError(f"unit must be one of {sorted(LENGTH_UNITS)}, got {unit!r}")


def _lengths(unit: str, completions: list[Any], completion_ids: list[list[int]] | None) -> list[int | None]:
    """Length of each completion in ``unit``; None for an empty completion (it earns no length reward)."""
    if unit == "tokens" and completion_ids is None:
        raise ValueError("unit='tokens' needs completion_ids; pass them or use unit='words' or 'chars'")
    ids = completion_ids if completion_ids is not None else [[]] * len(completions)
    texts = [completion_text(c) for c in completions]
    return [LENGTH_UNITS[unit](t, i) if t.strip() else None for t, i in zip(texts, ids, strict=True)]


def ideal_length_reward(
    target: int, width: int, falloff: str = "linear", unit: str = "tokens"
) -> Callable[..., list[float | None]]:
    """A reward peaking at 1.0 for a completion of ``target`` length and falling off either side.

    ``linear`` reaches 0.0 at ``target +- width``; ``gaussian`` is ``exp(-0.5 * ((length - target) / width)^2)``
    (0.61 at one ``width`` away). An empty completion scores 0.0.

    Args:
        target: the ideal length, in ``unit``.
        width: the falloff scale, in ``unit``.
        falloff: ``linear`` or ``gaussian``.
        unit: ``tokens`` (from ``completion_ids``), ``words`` or ``chars``.

    >>> reward = ideal_length_reward(target=4, width=2, unit="words")
    >>> reward(["a b c d", "a b c", "a", ""])
    [1.0, 0.5, 0.0, 0.0]
    >>> ideal_length_reward(100, 50, falloff="gaussian")(["x", "y"], completion_ids=[[0] * 100, [0] * 150])
    [1.0, 0.6065]
    """
    return IdealLengthReward(target, width, falloff, unit)


class IdealLengthReward:
    """The callable ``ideal_length_reward`` returns."""

    __name__ = "ideal_length_reward"

    def __init__(self, target: int, width: int, falloff: str = "linear", unit: str = "tokens") -> None:
        if target < 0 or width <= 0:
            raise ValueError(f"target must be >= 0 and width > 0, got target={target}, width={width}")
        if falloff not in FALLOFFS:
            raise ValueError(f"falloff must be one of {sorted(FALLOFFS)}, got {falloff!r}")
        _check_unit(unit)
        self.target, self.width, self.falloff, self.unit = target, width, falloff, unit

    def __call__(
        self, completions: list[Any], completion_ids: list[list[int]] | None = None, **kwargs: Any
    ) -> list[float | None]:
        shape = FALLOFFS[self.falloff]
        return [
            0.0 if n is None else round(shape(abs(n - self.target) / self.width), 4)
            for n in _lengths(self.unit, completions, completion_ids)
        ]


def length_bounds_reward(
    min_length: int = 1, max_length: int | None = None, unit: str = "tokens"
) -> Callable[..., list[float | None]]:
    """A reward of 1.0 for a completion whose length is within ``[min_length, max_length]``, else 0.0.

    Args:
        min_length: shortest allowed length, in ``unit``.
        max_length: longest allowed length; ``None`` for no upper bound.
        unit: ``tokens`` (from ``completion_ids``), ``words`` or ``chars``.

    >>> length_bounds_reward(min_length=2, max_length=3, unit="words")(["a b", "a b c d", "a", ""])
    [1.0, 0.0, 0.0, 0.0]
    """
    return LengthBoundsReward(min_length, max_length, unit)


class LengthBoundsReward:
    """The callable ``length_bounds_reward`` returns."""

    __name__ = "length_bounds_reward"

    def __init__(self, min_length: int = 1, max_length: int | None = None, unit: str = "tokens") -> None:
        if min_length < 0 or (max_length is not None and max_length < min_length):
            raise ValueError(
                f"need 0 <= min_length <= max_length (or max_length=None), got {min_length} and {max_length}"
            )
        _check_unit(unit)
        self.min_length, self.max_length, self.unit = min_length, max_length, unit

    def __call__(
        self, completions: list[Any], completion_ids: list[list[int]] | None = None, **kwargs: Any
    ) -> list[float | None]:
        upper = math.inf if self.max_length is None else self.max_length
        return [
            float(n is not None and self.min_length <= n <= upper)
            for n in _lengths(self.unit, completions, completion_ids)
        ]


def soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable[..., list[float | None]]:
    """DAPO's soft overlong punishment (arXiv:2503.14476, Eq. 13), on token counts; same as TRL's.

    With ``L = len(completion_ids)``, ``L_max = max_completion_len`` and ``c = soft_punish_cache``:
    0 for ``L <= L_max - c``; ``(L_max - c - L) / c`` (linear from 0 to -1) up to ``L_max``; -1 beyond.
    It only punishes: set ``L_max`` to the sampler's ``max_completion_length`` so a truncated answer gets -1.

    Args:
        max_completion_len: ``L_max``, in tokens.
        soft_punish_cache: ``c``, the width of the linear zone; 0 makes it a hard cliff at ``L_max``.

    >>> punish = soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    >>> punish(completion_ids=[[1] * 80, [1] * 90, [1] * 100, [1] * 101])
    [0.0, -0.5, -1.0, -1.0]
    """
    return SoftOverlongPunishment(max_completion_len, soft_punish_cache)


class SoftOverlongPunishment:
    """The callable ``soft_overlong_punishment`` returns (``__name__`` as TRL's, so metrics line up)."""

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
        if max_completion_len < 1:
            raise ValueError(f"max_completion_len must be >= 1, got {max_completion_len}")
        if not 0 <= soft_punish_cache <= max_completion_len:
            raise ValueError(
                f"soft_punish_cache must be in [0, max_completion_len={max_completion_len}], got {soft_punish_cache}"
            )
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
        safe_length = self.max_completion_len - self.soft_punish_cache
        return [self._punish(len(ids), safe_length) for ids in completion_ids]

    def _punish(self, length: int, safe_length: int) -> float:
        if length <= safe_length:
            return 0.0
        if length <= self.max_completion_len:  # only reachable when soft_punish_cache > 0
            return (safe_length - length) / self.soft_punish_cache
        return -1.0
