"""Per-token log-probs + advantages -> the GRPO-family loss. Pure functions: no model, no trainer, no logging.

Papers: GRPO arXiv:2402.03300, DAPO arXiv:2503.14476, Dr. GRPO arXiv:2503.20783, GSPO arXiv:2507.18071.
For a single micro-batch on one process the value equals TRL 1.16's ``GRPOTrainer._compute_loss``.

Where we deviate from TRL, on purpose:
- ``bnpo`` divides by the active tokens of the whole local generation batch, not of each micro-batch, so
  splitting a step into micro-batches never changes the update (TRL's bnpo does change with accumulation).
- ``grpo`` and ``dr_grpo`` divide by the local batch's completion count rather than by micro-batch count
  times accumulation steps; equal when micro-batches are equal-sized, exact when they are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SAMPLING_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class LossNormalizer:
    """Counts of the whole generation batch that each reduction divides by, so micro-batches add up."""

    num_sequences: int  # completions in the local generation batch (N)
    num_tokens: float  # loss-masked tokens in the local generation batch
    global_num_tokens: float  # loss-masked tokens on all ranks
    world_size: int = 1
    max_completion_length: int = 1

    @classmethod
    def from_mask(cls, mask: Tensor, max_completion_length: int | None = None) -> LossNormalizer:
        """Counts for a batch that is its own generation batch on one process (TRL's single micro-batch)."""
        tokens = mask.sum().item()
        return cls(mask.shape[0], tokens, tokens, 1, max_completion_length or mask.shape[1])


def sequence_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """grpo: mean over each completion's tokens, then mean over completions."""
    return (masked_loss.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / norm.num_sequences


def token_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """bnpo: sum over tokens / active tokens of the local batch."""
    return masked_loss.sum() / max(norm.num_tokens, 1.0)


def constant_length_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """dr_grpo: sum / (N * max_completion_length), free of any length bias."""
    return masked_loss.sum() / (norm.num_sequences * norm.max_completion_length)


def global_token_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """dapo: sum / (active tokens on all ranks / world size); DDP's gradient mean then gives a global token mean."""
    return masked_loss.sum() / (max(norm.global_num_tokens, 1.0) / norm.world_size)


REDUCTIONS: dict[str, Callable[[Tensor, Tensor, LossNormalizer], Tensor]] = {
    "grpo": sequence_mean,
    "bnpo": token_mean,
    "dr_grpo": constant_length_mean,
    "dapo": global_token_mean,
}


@dataclass
class LossOutput:
    loss: Tensor  # scalar, carries the gradient
    token_sums: dict[str, Tensor] = field(default_factory=dict)  # metric -> sum over masked tokens (detached)
    num_tokens: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # masked tokens summed over

    def __add__(self, other: LossOutput) -> LossOutput:
        """Combine micro-batches: losses and token sums add."""
        sums = {k: self.token_sums.get(k, 0.0) + v for k, v in other.token_sums.items()}
        return LossOutput(self.loss + other.loss, sums, self.num_tokens + other.num_tokens)

    def metrics(self) -> dict[str, float]:
        """Token-mean of each metric, with TRL's names (``kl``, ``clip_ratio/low_mean`` ...)."""
        n = max(float(self.num_tokens), 1.0)
        return {name: float(total) / n for name, total in self.token_sums.items()}


def grpo_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logps: Tensor | None = None,
    beta: float = 0.0,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    normalizer: LossNormalizer | None = None,
    max_completion_length: int | None = None,
    sampling_weights: Tensor | None = None,
) -> LossOutput:
    """Clipped-surrogate policy loss with optional k3 KL penalty.

    Args:
        logps: [n, T] per-token log-probs under the current policy (with grad).
        old_logps: [n, T] log-probs under the policy that sampled; ``None`` means ``logps.detach()``
            (one optimisation pass per generation batch: ratio 1, loss value ~0, gradient not 0).
        advantages: [n] one advantage per completion.
        mask: [n, T] 1 on tokens that count in the loss.
        ref_logps: [n, T] reference-model log-probs; required when ``beta > 0``.
        beta: weight of the per-token KL estimate ``exp(ref - logp) - (ref - logp) - 1``.
        loss_type: one of ``REDUCTIONS`` (grpo, bnpo, dr_grpo, dapo).
        epsilon: lower clip, ratio floor ``1 - epsilon``.
        epsilon_high: upper clip, ratio ceiling ``1 + epsilon_high``; defaults to ``epsilon`` (DAPO uses 0.28).
        delta: optional cap on the unclipped ratio (two-sided clipping); must exceed ``1 + epsilon_high``.
        importance_sampling_level: "token" (GRPO) or "sequence" (GSPO: the mean log-ratio of a completion).
        normalizer: counts of the whole generation batch; ``None`` treats ``mask`` as the whole batch.
        max_completion_length: the divisor of dr_grpo when ``normalizer`` is ``None``; defaults to T.
        sampling_weights: [n, T] or [n, 1] ``sampling_correction`` weights on the policy term (not the KL).
    """
    if loss_type not in REDUCTIONS:
        raise ValueError(f"loss_type must be one of {sorted(REDUCTIONS)}, got {loss_type!r}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {list(IMPORTANCE_SAMPLING_LEVELS)}, "
            f"got {importance_sampling_level!r}"
        )
    if beta > 0 and ref_logps is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logps (the reference model's log-probs)")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.to(logps.dtype)
    norm = normalizer or LossNormalizer.from_mask(mask, max_completion_length)
    old_logps = logps.detach() if old_logps is None else old_logps

    log_ratio = logps - old_logps  # [n, T]
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [n, 1]
    ratio = torch.exp(log_ratio)  # [n, T] or [n, 1]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    adv = advantages.unsqueeze(-1)  # [n, 1]
    per_token_loss = -torch.min(capped * adv, clipped * adv)  # [n, T] or [n, 1]
    if sampling_weights is not None:
        per_token_loss = per_token_loss * sampling_weights  # [n, T]

    sums: dict[str, Tensor] = {}
    if beta > 0:
        diff = ref_logps - logps  # [n, T]
        kl = torch.exp(diff) - diff - 1  # k3 estimator, >= 0
        per_token_loss = per_token_loss + beta * kl
        sums["kl"] = (kl.detach() * mask).sum()
    per_token_loss = per_token_loss.expand_as(mask)  # [n, T]
    loss = REDUCTIONS[loss_type](per_token_loss * mask, mask, norm)

    low = ((ratio < 1 - epsilon) & (adv < 0)).expand_as(mask).to(mask.dtype)
    high = ((ratio > 1 + epsilon_high) & (adv > 0)).expand_as(mask).to(mask.dtype)
    sums["clip_ratio/low_mean"] = (low * mask).sum().detach()
    sums["clip_ratio/high_mean"] = (high * mask).sum().detach()
    sums["clip_ratio/region_mean"] = (((low + high) > 0).to(mask.dtype) * mask).sum().detach()
    return LossOutput(loss, sums, mask.sum().detach())


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


def loss_mask(completion_mask: Tensor, is_truncated: Tensor, mask_truncated_completions: bool) -> Tensor:
    """[N, T] tokens that count in the loss: DAPO drops completions that never emitted EOS."""
    if not mask_truncated_completions:
        return completion_mask
    return completion_mask * (~is_truncated).unsqueeze(1).to(completion_mask.dtype)
