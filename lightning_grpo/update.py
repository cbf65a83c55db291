"""A generation batch's targets -> optimiser steps, planned and driven: the one place an optimiser step is made.

- planned: ``optimiser_steps`` (each step's rows, micro-batches and normaliser), ``entropy_cut`` (its entropy
  threshold), ``step_fault`` (whether it may be taken);
- driven: ``Update`` (the passes, the backward of each micro-batch, the gradient check and clip, the optimiser and
  schedule step, a step skipped). ``GRPOModule`` calls ``Update.run`` once a training step.

Knows the Policy, the targets and the loss settings; nothing about how the rollout was sampled or scored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_grpo.checkpoints import numerical_abort
from lightning_grpo.loss import LossConfig, LossNormalizer, LossOutput
from lightning_grpo.loss.entropy import EntropyController, entropy_threshold, high_entropy_mask
from lightning_grpo.metrics import StepCounters
from lightning_grpo.model.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.targets import EntropyCut, Targets, TargetSettings
from lightning_grpo.targets.build import normalizer, split_rows
from lightning_grpo.types import RewardScores, Rollout


@dataclasses.dataclass(frozen=True)
class TrainedStep:
    """A step that updated the weights, as ``GRPOModule._publish`` logs it and hands it to the callbacks."""

    rollout: Rollout
    scores: RewardScores  # this rank's
    every_rank: Tensor  # [W*N, F] every rank's per-function rewards
    targets: Targets  # settled: the correction's weights and mismatch
    loss: LossOutput  # every rank's
    extra: dict[str, float | Tensor]  # the filter's and the rollout's staleness metrics


FAULTS = ("rewards are infinite", "advantages are infinite or NaN", "gradients are infinite or NaN")


def step_fault(faults: Tensor | None, grad_norm: Tensor | None) -> str | None:
    """Why an optimiser step may not be taken, if it may not: the targets' ``faults``, then the gradient norm's (not
    finite). One read of the device for the three, after the step's backward passes: the host then waits once,
    where the step needs the answer, and not before each stage. ``grad_norm=None``: not checked here (fp16's
    GradScaler skips such steps itself).

    >>> step_fault(torch.tensor([False, True]), torch.tensor(float("inf")))
    'advantages are infinite or NaN'
    >>> step_fault(None, torch.tensor(1.0)) is None
    True
    """
    checks, names = [], []
    if faults is not None:
        checks.append(faults)
        names += FAULTS[:2]
    if grad_norm is not None:
        checks.append(~grad_norm.isfinite().view(1))
        names.append(FAULTS[2])
    flags = torch.cat(checks).tolist() if checks else []  # the one read
    return next((name for name, bad in zip(names, flags) if bad), None)


@dataclass(frozen=True)
class OptimiserStep:
    """One optimiser step's share of the generation batch."""

    rows: slice | Tensor  # the batch's rows in this step: all, or [n] indices of whole groups
    micro_batches: list[slice] | list[Tensor]  # the rows of one forward/backward pass each
    normalizer: LossNormalizer  # counts of this step's rows (and of every rank's)


@torch.no_grad()
def entropy_cut(
    policy: Policy, rollout: Rollout, targets: Targets, step: OptimiserStep, quantile: float, ranks: Ranks
) -> EntropyCut | None:
    """The step's ``EntropyCut`` (a collective), from a forward without gradient over its micro-batches; ``None``
    when the step is one micro-batch on one rank, whose own threshold is then the step's (no extra forward)."""
    if quantile >= 1 or (len(step.micro_batches) == 1 and ranks.world_size == 1):
        return None
    entropies = torch.zeros_like(targets.mask, dtype=torch.float32)  # [N, T]
    for rows in step.micro_batches:
        entropies[rows] = policy.token_logps(rollout, rows).entropy.float()
    mask, entropies = targets.mask[step.rows], entropies[step.rows]  # [n, T] the step's rows
    threshold = entropy_threshold(ranks.gather_padded(entropies), ranks.gather_padded(mask), quantile)
    return EntropyCut(threshold, high_entropy_mask(entropies, mask, quantile, threshold).sum().float())


def optimiser_steps(targets: Targets, s: TargetSettings, ranks: Ranks) -> list[OptimiserStep]:
    """The generation batch split into ``steps_per_generation`` optimiser steps of whole groups, in a random
    order (TRL shuffles the generation batch before splitting it) drawn from the step's seeded RNG; one step
    takes the batch as it is."""
    parts, group_size = s.update.steps_per_generation, s.group_size
    if parts == 1:
        return [OptimiserStep(slice(None), targets.micro_batches, targets.normalizer)]
    num_groups = targets.mask.shape[0] // group_size
    if num_groups % parts:
        raise ValueError(
            f"update.steps_per_generation={parts} must divide the prompts of a generation batch on each rank "
            f"({num_groups}): set data.batch_size to a multiple of it"
        )
    order = torch.randperm(num_groups)
    rows = (order.unsqueeze(1) * group_size + torch.arange(group_size)).view(-1)  # [N] whole groups, shuffled
    steps = []
    for part in rows.chunk(parts):
        mask = targets.mask[part]
        known = targets.row_lengths
        lengths = [(0, 1)] * len(part) if known is None else [known[i] for i in part.tolist()]
        micro = [part[rows] for rows in split_rows(lengths, s.update, s.micro_batch_unit, ranks)]
        steps.append(OptimiserStep(part, micro, normalizer(mask, ranks, s.max_completion_length)))
    return steps


class Update:
    """Drives a generation batch's optimiser steps: ``num_iterations`` passes over ``optimiser_steps``, each step
    accumulating gradients over its micro-batches (manual optimisation, ``module.manual_backward``)."""

    def __init__(
        self,
        targets: TargetSettings,
        loss: LossConfig,
        num_iterations: int,
        max_grad_norm: float | None,
        max_bad_steps: int,
    ) -> None:
        self.targets, self.loss, self.num_iterations, self.max_grad_norm = targets, loss, num_iterations, max_grad_norm
        self.max_bad_steps = max_bad_steps
        self.grad_norm = torch.tensor(float("nan"))  # the last optimiser step's, before clipping: train/grad_norm

    def run(
        self, module: L.LightningModule, policy: Policy, rollout: Rollout, targets: Targets, entropy: EntropyController
    ) -> tuple[LossOutput | None, int, str | None]:
        """The last step's loss, the steps taken, and why the update ended early (a step that was not taken)."""
        ranks = Ranks(module.trainer)
        steps, loss, taken = optimiser_steps(targets, self.targets, ranks), None, 0
        for _ in range(self.num_iterations):
            for step in steps:
                loss, fault = self._step(module, policy, rollout, targets, step, entropy)
                if fault is not None:
                    return None, taken, fault
                taken += 1
        return loss, taken, None

    def _step(
        self,
        module: L.LightningModule,
        policy: Policy,
        rollout: Rollout,
        targets: Targets,
        step: OptimiserStep,
        entropy: EntropyController,
    ) -> tuple[LossOutput | None, str | None]:
        """One optimiser step over ``step``'s rows, gradients accumulated across micro-batches: its loss, or why it
        was not taken (rewards, advantages or gradients that are not finite)."""
        optimizer, total, ranks = module.optimizers(), None, Ranks(module.trainer)
        cut = entropy_cut(policy, rollout, targets, step, self.loss.top_entropy_quantile, ranks)  # the threshold
        optimizer.zero_grad()
        for rows in step.micro_batches:
            token = policy.train_logps(rollout, rows, entropy_grad=entropy.enabled)
            out = targets.loss(token, rows, step.normalizer, self.loss, entropy.coef_to_apply(), cut)
            out.loss = out.loss + targets.distill_loss(policy, rollout, rows, step.normalizer)  # gkd's term
            module.manual_backward(out.loss + policy.aux_loss(token, step.normalizer.num_sequences))
            entropy.observe(out.trained_entropy, out.trained_tokens)
            out = dataclasses.replace(out, loss=out.loss.detach())
            total = out if total is None else total + out
        # fp16 AMP: gradients are unscaled inside optimizer.step (clipped there, in on_before_optimizer_step), and
        # the GradScaler skips steps with overflowing gradients and lowers its scale by itself
        fault = step_fault(targets.faults, None if grad_scaler(module.trainer) else self.clip(policy, module.trainer))
        if fault is not None:
            optimizer.zero_grad()
            return None, fault
        optimizer.step()
        optimizer.zero_grad()  # to None: the next rollout (decode's packed weights) runs without the stale gradients
        module.lr_schedulers().step()
        entropy.update(ranks.sum)  # the adaptive bonus moves once per optimiser step
        policy.after_optimizer_step(module.global_step)
        return total, None

    def skip(self, module: L.LightningModule, counters: StepCounters, fault: str, taken: int) -> None:
        """A step whose update ended at ``fault`` after ``taken`` optimiser steps: a warning, counted in
        ``train/skipped_steps``; ``max_bad_steps`` in a row stop training with an error, a checkpoint kept."""
        reason = fault if not taken else f"{fault} (after {taken} optimiser step(s) of the update)"
        in_a_row = counters.bad_step()
        module.log("train/skipped_steps", float(counters.skipped_steps), on_step=True, batch_size=1)
        if in_a_row < self.max_bad_steps:
            rank_zero_warn(f"GRPO step skipped at global step {module.global_step}: {reason}")
            return None
        raise numerical_abort(module.trainer, f"{in_a_row} GRPO steps in a row skipped ({reason})")

    def clip(self, policy: Policy, trainer: Any) -> Tensor:
        """Clip the gradients to ``optim.max_grad_norm``; their norm before (kept for ``train/grad_norm``)."""
        self.grad_norm = policy.clip_gradients(self.max_grad_norm, trainer.strategy)
        return self.grad_norm


def grad_scaler(trainer: Any) -> Any:
    """fp16 AMP's GradScaler, or None."""
    return getattr(trainer.precision_plugin, "scaler", None)
