"""Rewards -> group-relative advantages. Pure tensor math: knows nothing of models, ranks or logging.

GRPO (arXiv:2402.03300) scores each completion against the other completions of its prompt:
``A = (r - mean_group(r)) / (std + 1e-4)``. The std is the group's (``"group"``, default), the whole batch's
(``"batch"``), or not used (``"none"``, Dr. GRPO arXiv:2503.20783). Std is unbiased (n - 1), as in TRL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SCALE_REWARDS = ("group", "batch", "none")
STD_EPS = 1e-4  # TRL's constant: keeps a near-constant group from blowing up


@dataclass
class Advantages:
    advantages: Tensor  # [N] 0 where the reward was NaN (every function said "not applicable")
    group_std: Tensor  # [N/G] per-group reward std, for collapse monitoring


def zero_std_fraction(grouped: Tensor) -> float:
    """Fraction of groups ([groups, G] rewards) whose rewards are all equal: they carry no policy gradient.
    NaN ("not applicable") rewards are left out; a group with fewer than two rewards counts as equal. As TRL:
    the group's std is close to 0 (``torch.isclose``'s default tolerance).

    >>> zero_std_fraction(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.5, float("nan")]]))
    0.6666666865348816
    """
    std = nanstd(grouped, dim=1).nan_to_num(0.0)  # [groups]
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


def nanstd(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std ignoring NaN; NaN where fewer than two values are present."""
    count = (~x.isnan()).sum(dim=dim, keepdim=True) if dim is not None else (~x.isnan()).sum()
    mean = x.nanmean(dim=dim, keepdim=True) if dim is not None else x.nanmean()
    var = ((x - mean) ** 2).nansum(dim=dim, keepdim=True) if dim is not None else ((x - mean) ** 2).nansum()
    std = (var / (count - 1)).sqrt()
    std = torch.where(count > 1, std, torch.nan)
    return std if keepdim or dim is None else std.squeeze(dim)


def group_advantages(rewards: Tensor, group_size: int, scale_rewards: str = "group") -> Tensor:
    """Group-relative advantages; shorthand for ``compute_advantages(...).advantages``.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale_rewards="none")
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    """
    return compute_advantages(rewards, group_size, scale_rewards).advantages


def compute_advantages(rewards: Tensor, group_size: int, scale_rewards: str = "group") -> Advantages:
    """Advantages of N completions in groups of G consecutive rows.

    Args:
        rewards: [N] total reward per completion; NaN means no function applied (advantage 0).
        group_size: G, completions per prompt.
        scale_rewards: "group", "batch" or "none" (see module docstring).
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {list(SCALE_REWARDS)}, got {scale_rewards!r}")
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: expected [N] with N divisible into whole groups of "
            f"num_generations={group_size}"
        )
    dtype = rewards.dtype
    # float64: in float32 the mean of G equal rewards can miss by an ulp, and dividing by (std + 1e-4) turns
    # that into a same-sign advantage for the whole group (0.0024 for five rewards of 3.8).
    rewards = rewards.double()
    grouped = rewards.view(-1, group_size)  # [N/G, G]
    group_mean = grouped.nanmean(dim=1, keepdim=True)  # [N/G, 1]
    group_std = nanstd(grouped, dim=1)  # [N/G]
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)  # [N]
    else:
        std = group_std.repeat_interleave(group_size)  # [N]
    advantages = (grouped - group_mean).view(-1)  # [N]
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPS)
    return Advantages(
        advantages=torch.nan_to_num(advantages, nan=0.0).to(dtype),
        group_std=torch.nan_to_num(group_std, nan=0.0).to(dtype),
    )
