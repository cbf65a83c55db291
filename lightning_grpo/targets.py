"""A scored rollout -> what the loss is computed against: loss mask, advantages, normaliser, sampling-policy and
reference log-probs, sampler-correction weights, and the micro-batch slices. Each is computed once per
generation batch and serves every optimiser step on it (``num_iterations``).

Knows the Policy (for log-probs) and the rank collectives (for the global token count); nothing about rewards.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lightning_grpo.loss import LossNormalizer, loss_mask, sampling_correction
from lightning_grpo.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import Rollout


@dataclass
class TargetSettings:
    """The module settings that shape the targets (see ``GRPOModule`` for each)."""

    beta: float = 0.0
    num_iterations: int = 1
    mask_truncated_completions: bool = False
    micro_batch_size: int | None = None
    max_completion_length: int = 256
    sampling_correction: str | None = "sequence_mask"
    sampling_correction_max: float = 3.0


@dataclass
class Targets:
    """What every optimiser step on one generation batch is computed against (N rows each)."""

    advantages: Tensor  # [N]
    mask: Tensor  # [N, T] tokens in the loss: the model's own, up to EOS, less dropped truncated completions
    normalizer: LossNormalizer
    micro_batches: list[slice]  # row slices of one forward/backward pass each
    old_logps: Tensor | None  # [N, T] the sampling policy's, when num_iterations > 1
    ref_logps: Tensor | None  # [N, T] when beta > 0
    sampling_weights: Tensor | None  # [N, T] or [N, 1] when another engine sampled (vLLM)


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Row slices of ``size`` (the last may be shorter); ``None`` is one slice of all ``n`` rows.

    >>> micro_batches(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    size = size or n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def rows_of(t: Tensor | None, rows: slice) -> Tensor | None:
    return None if t is None else t[rows]


def normalizer(mask: Tensor, ranks: Ranks, max_completion_length: int) -> LossNormalizer:
    """Token and sequence counts of the generation batch, local and over every rank (a collective)."""
    tokens = mask.sum()
    return LossNormalizer(
        num_sequences=mask.shape[0],
        num_tokens=tokens.item(),
        global_num_tokens=float(ranks.sum(tokens)),
        world_size=ranks.world_size,
        max_completion_length=max_completion_length,
    )


def build_targets(
    policy: Policy, rollout: Rollout, advantages: Tensor, settings: TargetSettings, ranks: Ranks
) -> Targets:
    """Everything the step's optimiser steps are computed against, each computed once."""
    s = settings
    mask = loss_mask(rollout.model_mask, rollout.is_truncated, s.mask_truncated_completions)  # [N, T]
    rows = micro_batches(len(rollout), s.micro_batch_size)
    correct = rollout.sampling_logps is not None and s.sampling_correction is not None
    old_logps = policy.logps(rollout, rows) if s.num_iterations > 1 or correct else None
    weights = None
    if correct:
        weights = sampling_correction(
            old_logps, rollout.sampling_logps, mask, s.sampling_correction, clip_max=s.sampling_correction_max
        )
    return Targets(
        advantages=advantages,
        mask=mask,
        normalizer=normalizer(mask, ranks, s.max_completion_length),
        micro_batches=rows,
        old_logps=old_logps if s.num_iterations > 1 else None,  # mu = 1: the ratio is exactly 1
        ref_logps=policy.reference_logps(rollout, rows) if s.beta > 0 else None,
        sampling_weights=weights,
    )
