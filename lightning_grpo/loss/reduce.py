"""Masked per-token losses -> a scalar, one reduction per loss type, and the table of loss types (a policy term and
a reduction each). Pure functions over tensors and the batch's counts (``LossNormalizer``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from lightning_grpo.loss.objectives import PolicyInputs, Term, cispo_term, clipped_surrogate, sapo_term, vespo_term

if TYPE_CHECKING:
    from lightning_grpo.loss.config import LossConfig


@dataclass
class LossNormalizer:
    """Counts of the whole generation batch that each reduction divides by, so micro-batches add up."""

    num_sequences: int  # completions in the local generation batch (N)
    num_tokens: float | Tensor  # loss-masked tokens in the local generation batch (0-d on the device in a step)
    global_num_tokens: float | Tensor  # loss-masked tokens on all ranks
    world_size: int = 1
    max_completion_length: int = 1
    num_trained_tokens: float | Tensor | None = None  # of those, kept by top_entropy_quantile (targets.EntropyCut)

    @classmethod
    def from_mask(cls, mask: Tensor, max_completion_length: int | None = None) -> LossNormalizer:
        """Counts for a batch that is its own generation batch on one process (TRL's single micro-batch)."""
        tokens = mask.sum().item()
        return cls(mask.shape[0], tokens, tokens, 1, max_completion_length or mask.shape[1])


def at_least_one(count: float | Tensor) -> float | Tensor:
    """A count to divide by, at least 1; a tensor stays on its device (no host read).

    >>> import torch
    >>> at_least_one(0.0), at_least_one(torch.tensor(3.0))
    (1.0, tensor(3.))
    """
    return count.clamp(min=1.0) if isinstance(count, Tensor) else max(count, 1.0)


def sequence_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """grpo, sapo: mean over each completion's tokens, then mean over completions."""
    return (masked_loss.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / norm.num_sequences


def sequence_sum_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """luspo: sum over each completion's tokens (a sequence-level loss scaled by its length), mean over them."""
    return masked_loss.sum() / norm.num_sequences


def token_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """bnpo: sum over tokens / active tokens of the local batch."""
    return masked_loss.sum() / at_least_one(norm.num_tokens)


def constant_length_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """dr_grpo: sum / (N * max_completion_length), free of any length bias."""
    return masked_loss.sum() / (norm.num_sequences * norm.max_completion_length)


def global_token_mean(masked_loss: Tensor, mask: Tensor, norm: LossNormalizer) -> Tensor:
    """dapo, cispo, vespo: sum / (active tokens on all ranks / world size); DDP's mean makes it global."""
    return masked_loss.sum() / (at_least_one(norm.global_num_tokens) / norm.world_size)


@dataclass(frozen=True)
class LossType:
    term: Callable[[PolicyInputs, LossConfig], Term]
    reduce: Callable[[Tensor, Tensor, LossNormalizer], Tensor]
    weights_in_term: bool = False  # the term folds sampling weights in itself (VESPO), instead of multiplying


LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType(clipped_surrogate, sequence_mean),
    "bnpo": LossType(clipped_surrogate, token_mean),
    "dr_grpo": LossType(clipped_surrogate, constant_length_mean),
    "dapo": LossType(clipped_surrogate, global_token_mean),
    "luspo": LossType(clipped_surrogate, sequence_sum_mean),
    "cispo": LossType(cispo_term, global_token_mean),
    "sapo": LossType(sapo_term, sequence_mean),
    "vespo": LossType(vespo_term, global_token_mean, weights_in_term=True),
}
