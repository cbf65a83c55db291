"""The two rules every stage shares about rewards: their weighted sum, and when a group "has no signal" (one
tolerance, asked by advantages, dynamic sampling, the step metrics and the collapse alert)."""

from __future__ import annotations

import torch
from torch import Tensor

# A group whose rewards' std is within this of 0 carries no policy gradient: TRL's ``torch.isclose(std, 0)``.
# Advantages, dynamic sampling, the step metrics and the collapse alert all ask ``without_signal``.
SIGNAL_ATOL = 1e-8


def nanstd(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased std ignoring NaN; NaN where fewer than two values are present: TRL's ``trl.trainer.utils.nanstd``,
    imported on first use so that ``import lightning_grpo`` does not load TRL.

    >>> nanstd(torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("nan"), float("nan")]]), dim=1)
    tensor([1.4142,    nan])
    """
    from trl.trainer.utils import nanstd as trl_nanstd

    return trl_nanstd(x, dim=dim, keepdim=keepdim)


def without_signal(grouped: Tensor) -> Tensor:
    """[groups, G] rewards -> [groups] True where they carry no signal: all equal (NaN ignored, computed in
    float64 so equal rewards give exactly 0) or fewer than two of them.

    >>> without_signal(torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, float("nan")], [1.0, 1.0 + 1e-12]])).tolist()
    [True, False, True, True]
    """
    std = nanstd(grouped.double(), dim=1).nan_to_num(0.0)  # [groups]
    return std.abs() <= SIGNAL_ATOL


def zero_std_fraction(grouped: Tensor) -> float:
    """[groups, G] rewards -> the fraction of groups ``without_signal`` (TRL's ``frac_reward_zero_std``).

    >>> zero_std_fraction(torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, float("nan")]]))
    0.6666666666666666
    """
    return without_signal(grouped).double().mean().item()


def weighted_total(per_function: Tensor, weights: Tensor) -> Tensor:
    """[N, F] scores (NaN: the function returned None) and [F] weights -> [N] weighted sum over the functions
    that applied; NaN where none did.

    >>> weighted_total(torch.tensor([[1.0, float("nan")], [float("nan"), float("nan")]]), torch.tensor([2.0, 1.0]))
    tensor([2., nan])
    """
    total = (per_function * weights.to(per_function)).nansum(dim=1)
    return torch.where(per_function.isnan().all(dim=1), torch.nan, total)
