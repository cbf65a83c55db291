"""Completions + reward functions -> a [N, F] score table. Knows the reward-function convention, not the model.

The ecosystem's convention (TRL, open-r1): ``fn(prompts, completions, completion_ids, **columns)`` returns
one ``float`` or ``None`` per completion, where ``None`` means "not applicable to this sample".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_grpo.types import RewardScores, Rollout

RewardFunc = Callable[..., Sequence[float | None]]


def reward_name(fn: RewardFunc) -> str:
    """The name metrics use: ``rewards/<name>/mean``."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def check_reward_weights(reward_funcs: Sequence[RewardFunc], weights: Sequence[float] | None) -> list[float]:
    """One weight per function (default 1.0 each)."""
    if not reward_funcs:
        raise ValueError("reward_funcs is empty: give at least one reward function (callable or import path)")
    for fn in reward_funcs:
        if not callable(fn):
            raise TypeError(f"reward_funcs entries must be callables, got {fn!r} ({type(fn).__name__})")
    if weights is None:
        return [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {len(weights)} values for {len(reward_funcs)} reward functions "
            f"{[reward_name(f) for f in reward_funcs]}: give one weight per function"
        )
    return [float(w) for w in weights]


def _check_values(name: str, values: Any, n: int) -> list[float]:
    if values is None or isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise TypeError(
            f"reward function {name!r} returned {values!r}: it must return a list of {n} floats or None"
        )
    if len(values) != n:
        raise ValueError(
            f"reward function {name!r} returned {len(values)} values for {n} completions: "
            "it must return one float (or None) per completion"
        )
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            out.append(float(v))
        else:
            raise TypeError(
                f"reward function {name!r} returned {v!r} ({type(v).__name__}) for completion {i}: "
                "each value must be a float or None"
            )
    return out


def call_reward(fn: RewardFunc, rollout: Rollout, columns: dict[str, list[Any]]) -> list[float]:
    """One function over all N completions, its output checked."""
    name = reward_name(fn)
    completion_ids = [
        ids[mask.bool()].tolist() for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)
    ]
    try:
        values = fn(
            prompts=rollout.prompts, completions=rollout.completions, completion_ids=completion_ids, **columns
        )
    except Exception as err:
        raise RuntimeError(f"reward function {name!r} raised {type(err).__name__}: {err}") from err
    return _check_values(name, values, len(rollout))


def score_rollout(
    reward_funcs: Sequence[RewardFunc],
    weights: Sequence[float],
    rollout: Rollout,
    columns: dict[str, list[Any]],
) -> RewardScores:
    """Score N completions; ``columns`` hold B values each and are repeated G times to line up."""
    repeated = {k: [v for v in values for _ in range(rollout.group_size)] for k, values in columns.items()}
    table = [call_reward(fn, rollout, repeated) for fn in reward_funcs]  # [F][N]
    device = rollout.completion_ids.device
    return RewardScores(
        per_function=torch.tensor(table, dtype=torch.float32, device=device).T.reshape(len(rollout), -1),
        names=[reward_name(fn) for fn in reward_funcs],
        weights=torch.tensor(list(weights), dtype=torch.float32, device=device),
    )
