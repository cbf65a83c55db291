"""Sampler and trainer log-probs -> importance weights that correct for their mismatch, and its metrics. Pure
tensor math: knows nothing of engines or models.

When another engine (vLLM) samples the completions, its log-probs differ from the trainer's (kernels, precision,
weights one sync behind), so the loss is re-weighted by the probability ratio of the trained policy to the
sampler, as TRL 1.16 does (``vllm_importance_sampling_correction``).
"""

from __future__ import annotations

import math

from torch import Tensor

SAMPLING_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def sampling_correction(
    old_logps: Tensor,
    sampling_logps: Tensor,
    mask: Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Tensor:
    """Importance weights for tokens sampled by another engine (vLLM) than the one trained, as TRL 1.16 does.

    ``rho = exp(old_logps - sampling_logps)`` per token (``token_*``) or per completion (``sequence_*``,
    the sum over its tokens); ``*_truncate`` clamps rho to ``[clip_min, clip_max]``, ``*_mask`` zeroes
    weights outside it. The policy term of the per-token loss is multiplied by the result ([n, T] or [n, 1]).

    >>> import torch
    >>> old, sampled, mask = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.5, -2.0]]), torch.ones(1, 2)
    >>> sampling_correction(old, sampled, mask, "token_truncate", clip_max=2.0)  # e^0.5 = 1.65, e^1 capped at 2
    tensor([[1.6487, 2.0000]])
    >>> sampling_correction(old, sampled, mask, "sequence_mask", clip_max=3.0)  # e^1.5 = 4.48 > 3: masked
    tensor([[0.]])
    """
    if mode not in SAMPLING_CORRECTIONS:
        raise ValueError(f"sampling_correction must be one of {list(SAMPLING_CORRECTIONS)}, got {mode!r}")
    diff = ((old_logps - sampling_logps) * mask).nan_to_num(0.0)  # [n, T]
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)  # [n, 1]
    rho = diff.exp()
    if mode.endswith("truncate"):
        return rho.clamp(clip_min, clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return rho.masked_fill((rho < low) | (rho > high), 0.0)


def correction_metrics(weights: Tensor | None, mask: Tensor) -> dict[str, float]:
    """min / mean / max of the correction weights over the loss tokens, with TRL's names; none without them.

    >>> import torch
    >>> correction_metrics(torch.tensor([[0.5], [2.0]]), torch.ones(2, 3))
    {'sampling/importance_sampling_ratio/min': 0.5, 'sampling/importance_sampling_ratio/mean': 1.25, \
'sampling/importance_sampling_ratio/max': 2.0}
    """
    if weights is None:
        return {}
    active = weights.expand_as(mask)[mask.bool()]  # [tokens]
    if not active.numel():
        return {}
    values = (active.min(), active.mean(), active.max())
    return {f"sampling/importance_sampling_ratio/{k}": v.item() for k, v in zip(("min", "mean", "max"), values)}
