"""A scored rollout -> what the loss is computed against: loss mask, advantages, normaliser, sampling-policy and
reference log-probs, sampler-correction weights, and the micro-batch slices. Each is computed once per
generation batch and serves every optimiser step on it: ``steps_per_generation`` steps, each on its share of
the batch's groups, repeated ``num_iterations`` times (TRL's order).

Knows the Policy (for log-probs) and the rank collectives (for the global token count); nothing about rewards.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_grpo.loss.grpo import LossNormalizer, loss_mask, sampling_correction
from lightning_grpo.model.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import Rollout


@dataclass(frozen=True)
class TargetSettings:
    """The module settings that shape the targets (see ``GRPOModule`` for each)."""

    reference: bool = False  # reference log-probs are needed (loss.beta > 0 or advantages.kl_coef > 0)
    num_iterations: int = 1
    steps_per_generation: int = 1
    mask_truncated_completions: bool = False
    micro_batch_size: int | None = None
    max_completion_length: int = 256
    sampling_correction: str | None = "sequence_mask"
    sampling_correction_max: float = 3.0

    @property
    def off_policy(self) -> bool:
        """Whether some optimiser step runs on weights that did not sample (the ratio is then not 1)."""
        return self.num_iterations > 1 or self.steps_per_generation > 1


@dataclass(frozen=True)
class Targets:
    """What every optimiser step on one generation batch is computed against (N rows each)."""

    advantages: Tensor | None  # [N] or [N, T]; ``None`` until the module has computed them (``with_advantages``)
    mask: Tensor  # [N, T] tokens in the loss: the model's own, up to EOS, less dropped truncated completions
    normalizer: LossNormalizer
    micro_batches: list[slice]  # row slices of one forward/backward pass each
    old_logps: Tensor | None  # [N, T] the sampling policy's, when some step is off-policy
    ref_logps: Tensor | None  # [N, T] when a reference is needed
    sampling_weights: Tensor | None  # [N, T] or [N, 1] when another engine sampled (vLLM)

    def with_advantages(self, advantages: Tensor) -> Targets:
        return dataclasses.replace(self, advantages=advantages)


@dataclass(frozen=True)
class OptimiserStep:
    """One optimiser step's share of the generation batch."""

    rows: slice | Tensor  # the batch's rows in this step: all, or [n] indices of whole groups
    micro_batches: list[slice] | list[Tensor]  # the rows of one forward/backward pass each
    normalizer: LossNormalizer  # counts of this step's rows (and of every rank's)


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Row slices of ``size`` (the last may be shorter); ``None`` is one slice of all ``n`` rows.

    >>> micro_batches(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    size = size or n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def rows_of(t: Tensor | None, rows: slice | Tensor) -> Tensor | None:
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


def build_targets(policy: Policy, rollout: Rollout, settings: TargetSettings, ranks: Ranks) -> Targets:
    """Everything the step's optimiser steps are computed against, each computed once; the advantages follow
    (``Targets.with_advantages``), as a token-level estimator may need the log-probs computed here."""
    s = settings
    mask = loss_mask(rollout.model_mask, rollout.is_truncated, s.mask_truncated_completions)  # [N, T]
    rows = micro_batches(len(rollout), s.micro_batch_size)
    correct = rollout.sampling_logps is not None and s.sampling_correction is not None
    old_logps = policy.logps(rollout, rows) if s.off_policy or correct else None
    weights = None
    if correct:
        weights = sampling_correction(
            old_logps, rollout.sampling_logps, mask, s.sampling_correction, clip_max=s.sampling_correction_max
        )
    return Targets(
        advantages=None,
        mask=mask,
        normalizer=normalizer(mask, ranks, s.max_completion_length),
        micro_batches=rows,
        old_logps=old_logps if s.off_policy else None,  # every step on-policy: the ratio is exactly 1
        ref_logps=policy.reference_logps(rollout, rows) if s.reference else None,
        sampling_weights=weights,
    )


def optimiser_steps(targets: Targets, group_size: int, settings: TargetSettings, ranks: Ranks) -> list[OptimiserStep]:
    """The generation batch split into ``steps_per_generation`` optimiser steps of whole groups, in a random
    order (TRL shuffles the generation batch before splitting it) drawn from the step's seeded RNG; one step
    takes the batch as it is."""
    parts = settings.steps_per_generation
    if parts == 1:
        return [OptimiserStep(slice(None), targets.micro_batches, targets.normalizer)]
    num_groups = targets.mask.shape[0] // group_size
    if num_groups % parts:
        raise ValueError(
            f"steps_per_generation={parts} must divide the prompts of a generation batch on each rank "
            f"({num_groups}): set data.batch_size to a multiple of it"
        )
    order = torch.randperm(num_groups)
    rows = (order.unsqueeze(1) * group_size + torch.arange(group_size)).view(-1)  # [N] whole groups, shuffled
    steps = []
    for part in rows.chunk(parts):
        mask = targets.mask[part]
        micro = list(part.split(settings.micro_batch_size or len(part)))
        steps.append(OptimiserStep(part, micro, normalizer(mask, ranks, settings.max_completion_length)))
    return steps
