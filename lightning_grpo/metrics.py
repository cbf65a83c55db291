"""Rollout + rewards + advantages -> the per-step numbers users compare across tools (TRL's names).

Pure functions over tensors already gathered from every rank; the module logs what they return.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.advantages import nanstd
from lightning_grpo.types import RewardScores


def reward_metrics(per_function: Tensor, weights: Tensor, names: list[str], group_size: int) -> dict[str, float]:
    """``reward``, ``reward_std``, ``rewards/<fn>/mean|std`` and ``frac_reward_zero_std`` of [N, F] scores."""
    total = RewardScores(per_function, names, weights).total  # [N]
    group_std = nanstd(total.view(-1, group_size), dim=1).nan_to_num(0.0)  # [N/G]
    out = {
        "reward": total.nanmean().item(),
        "reward_std": nanstd(total).nan_to_num(0.0).item(),
        "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item(),
    }
    for i, name in enumerate(names):
        column = per_function[:, i]
        scored = not column.isnan().all()  # a function that said None for every row logs NaN, as in TRL
        out[f"rewards/{name}/mean"] = column.nanmean().item()
        out[f"rewards/{name}/std"] = nanstd(column).nan_to_num(0.0).item() if scored else float("nan")
    return out


def completion_metrics(lengths: Tensor, is_truncated: Tensor) -> dict[str, float]:
    """Statistics of [N] completion lengths (tokens up to and including EOS); terminated = ended with EOS."""
    lengths = lengths.float()
    terminated = lengths[~is_truncated]
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": is_truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
    }


def accuracy(per_function: Tensor, names: list[str], accuracy_reward: str) -> float:
    """Fraction of scored completions the correctness function gave its full mark (>= 1.0)."""
    column = per_function[:, names.index(accuracy_reward)]
    scored = column[~column.isnan()]
    return (scored >= 1.0).float().mean().item() if scored.numel() else 0.0


def sampling_metrics(weights: Tensor | None, mask: Tensor) -> dict[str, float]:
    """min / mean / max of the sampling-correction weights over the loss tokens (none without correction)."""
    if weights is None:
        return {}
    active = weights.expand_as(mask)[mask.bool()]
    if not active.numel():
        return {}
    return {
        "sampling/importance_ratio/min": active.min().item(),
        "sampling/importance_ratio/mean": active.mean().item(),
        "sampling/importance_ratio/max": active.max().item(),
    }
