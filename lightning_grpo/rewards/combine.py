"""Reward functions + weights -> one weighted function, and named presets of ``(function, weight)`` pairs.

A preset is a plain list of pairs so it can be read, edited and split into the trainer's ``reward_funcs`` and
``reward_weights`` (``preset("math_reasoning")``); a YAML config can name one by its key in ``PRESETS``.
Each function keeps its own ``rewards/<name>/mean`` metric that way; ``combine`` trades that for one function.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

import torch

from lightning_grpo.rewards.calls import Calls, RewardCallConfig, call_rewards
from lightning_grpo.rewards.code_execution import code_execution_reward
from lightning_grpo.rewards.convention import RewardFunc, check_reward_weights, is_async_reward, reward_name
from lightning_grpo.rewards.correctness import fuzzy_match_reward, normalized_match_reward, rouge_l_reward
from lightning_grpo.rewards.format import python_syntax_reward, soft_think_format_reward
from lightning_grpo.rewards.length import length_bounds_reward
from lightning_grpo.rewards.math_equivalence import math_verify_reward
from lightning_grpo.rewards.style import reasoning_steps_reward, repetition_penalty
from lightning_grpo.types import weighted_total

RewardPairs = list[tuple[RewardFunc, float]]


def weighted(fn: RewardFunc, weight: float) -> RewardFunc:
    """``fn`` with every score multiplied by ``weight`` (``None`` stays ``None``), under ``fn``'s name.

    Prefer the trainer's ``reward_weights``; this is for code that takes bare functions.

    >>> from lightning_grpo.rewards.correctness import exact_match_reward
    >>> half = weighted(exact_match_reward, 0.5)
    >>> half(["7", "8", "9"], answer=["7", "7", None]), half.__name__
    ([0.5, 0.0, None], 'exact_match_reward')
    """
    return AsyncWeighted(fn, weight) if is_async_reward(fn) else Weighted(fn, weight)


class Weighted:
    """The callable ``weighted`` returns for a sync function."""

    def __init__(self, fn: RewardFunc, weight: float) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be a reward function (callable), got {fn!r}")
        if not math.isfinite(weight):
            raise ValueError(f"weight must be a finite number, got {weight}")
        self.fn, self.weight = fn, float(weight)
        self.__name__ = reward_name(fn)
        self.is_slow = getattr(fn, "is_slow", False)
        # Full marks stay 1.0 only at weight 1: accuracy counts scores >= 1.0.
        self.is_correctness = getattr(fn, "is_correctness", None) and self.weight == 1.0

    def _scale(self, values: Sequence[float | None]) -> list[float | None]:
        return [None if v is None else self.weight * v for v in values]

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        return self._scale(self.fn(*args, **kwargs))


class AsyncWeighted(Weighted):
    """The callable ``weighted`` returns for an ``async def`` function; itself async."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        return self._scale(await self.fn(*args, **kwargs))


def combine(pairs: Sequence[tuple[RewardFunc, float]], name: str = "combined_reward") -> RewardFunc:
    """One reward function returning the weighted sum of ``pairs``; ``None`` where every function said ``None``.

    Members run as the trainer would run them (async and slow ones concurrently), and a ``None`` from one
    member counts as absent, as in the trainer's total.

    Args:
        pairs: ``(function, weight)`` pairs, e.g. a preset.
        name: the ``__name__`` metrics will show.

    >>> from lightning_grpo.rewards.correctness import exact_match_reward
    >>> from lightning_grpo.rewards.format import soft_think_format_reward
    >>> both = combine([(exact_match_reward, 1.0), (soft_think_format_reward, 0.5)])
    >>> both(completions=["<think>hm</think>7", "7", "8"], answer=["7", "7", None])
    [1.5, 1.0, 0.0]
    """
    return Combined(pairs, name)


class Combined:
    """The callable ``combine`` returns."""

    def __init__(self, pairs: Sequence[tuple[RewardFunc, float]], name: str = "combined_reward") -> None:
        if not pairs:
            raise ValueError("pairs is empty: give at least one (function, weight) pair")
        self.funcs = [fn for fn, _ in pairs]
        self.weights = [float(w) for _, w in pairs]
        self.__name__ = name
        self.is_slow = any(is_async_reward(fn) or getattr(fn, "is_slow", False) for fn in self.funcs)

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        table = call_rewards(
            self.funcs, {"completions": completions, **kwargs}, len(completions), Calls(RewardCallConfig())
        )  # [F][N]
        totals = weighted_total(
            torch.tensor(table, dtype=torch.float64).T, torch.tensor(self.weights, dtype=torch.float64)
        )
        return [None if math.isnan(v) else v for v in totals.tolist()]


MATH_REASONING_REWARDS: RewardPairs = [
    (math_verify_reward, 1.0),  # reads ``answer`` (or ``solution``)
    (soft_think_format_reward, 0.2),
    (reasoning_steps_reward, 0.1),
    (repetition_penalty(n=3, max_penalty=1.0), 0.2),
]
CODE_GENERATION_REWARDS: RewardPairs = [
    (code_execution_reward, 1.0),  # reads ``test_cases``
    (python_syntax_reward, 0.1),
]
SUMMARIZATION_REWARDS: RewardPairs = [
    (rouge_l_reward, 1.0),  # reads the reference summary from ``answer``
    (length_bounds_reward(min_length=10, max_length=150, unit="words"), 0.2),
    (repetition_penalty(n=3, max_penalty=1.0), 0.5),
]
QA_REWARDS: RewardPairs = [
    (normalized_match_reward, 1.0),  # reads ``answer``
    (fuzzy_match_reward(threshold=0.8), 0.5),
    (length_bounds_reward(min_length=1, max_length=64, unit="words"), 0.1),
]
PRESETS: dict[str, RewardPairs] = {
    "math_reasoning": MATH_REASONING_REWARDS,
    "code_generation": CODE_GENERATION_REWARDS,
    "summarization": SUMMARIZATION_REWARDS,
    "qa": QA_REWARDS,
}


def preset(name: str) -> tuple[list[RewardFunc], list[float]]:
    """``(reward_funcs, reward_weights)`` of a named preset, ready for the trainer.

    >>> funcs, weights = preset("qa")
    >>> [f.__name__ for f in funcs], weights
    (['normalized_match_reward', 'fuzzy_match_reward', 'length_bounds_reward'], [1.0, 0.5, 0.1])
    """
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    pairs = PRESETS[name]
    return [fn for fn, _ in pairs], [weight for _, weight in pairs]


def reward_set(
    reward_funcs: Sequence[RewardFunc] | None, reward_weights: Sequence[float] | None, reward_preset: str | None
) -> tuple[list[RewardFunc], list[float]]:
    """``reward_funcs`` (callables or import paths) with their weights (1.0 each by default), then the preset's;
    refused when empty."""
    funcs = [resolved(fn) for fn in reward_funcs or []]
    weights = check_reward_weights(funcs, reward_weights) if funcs else []
    if reward_preset is not None:
        preset_funcs, preset_weights = preset(reward_preset)
        funcs, weights = funcs + preset_funcs, weights + preset_weights
    return funcs, check_reward_weights(funcs, weights)


def resolved(fn: RewardFunc | str) -> RewardFunc:
    """A reward function, or the one its import path (``trl.rewards.accuracy_reward``) names."""
    if not isinstance(fn, str):
        return fn
    module, _, name = fn.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"reward_funcs entry {fn!r} cannot be imported ({err}): give module.function") from err


def import_paths(reward_funcs: Sequence[RewardFunc | str]) -> list[str] | None:
    """The import path of each function, such that importing it gives the function back; ``None`` when one has
    none (a lambda, a ``partial``, an instance, a function of ``__main__``): that set cannot be restored by name.

    >>> import_paths([preset, "lightning_grpo.rewards.exact_match_reward"])
    ['lightning_grpo.rewards.combine.preset', 'lightning_grpo.rewards.exact_match_reward']
    >>> import_paths([lambda completions, **kw: [0.0] * len(completions)]) is None
    True
    """
    paths = []
    for fn in reward_funcs:
        path = fn if isinstance(fn, str) else f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
        if path.startswith("__main__.") or "<" in path:
            return None
        try:
            if resolved(path) is not resolved(fn):
                return None
        except ValueError:
            return None
        paths.append(path)
    return paths
