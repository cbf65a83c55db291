"""DAPO's dynamic sampling (arXiv:2503.14476; verl's ``algorithm.filter_groups``): groups whose rewards are all
equal carry no learning signal, so they are dropped, and the groups that remain are kept across generation
batches until there are enough for an update (counted on every rank). Bookkeeping over Rollouts and
RewardScores.

As in verl, the update waits (no optimiser step) while the buffer fills, surplus groups are dropped once it is
full, and the number of generation batches an update took is logged. Where we deviate: past
``max_num_gen_batches`` verl raises; we take the update on the groups there are (with a warning), so a hard
stretch of the dataset slows training instead of ending it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_grpo.advantages import nanstd
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import RewardScores, Rollout


def groups_with_signal(totals: Tensor, group_size: int) -> Tensor:
    """[N] total rewards -> [N/G] True where a group's rewards differ (a non-zero std; NaN rewards left out).

    >>> groups_with_signal(torch.tensor([1.0, 0.0, 1.0, 1.0, float("nan"), 2.0]), 2).tolist()
    [True, False, False]
    """
    std = nanstd(totals.double().view(-1, group_size), dim=1)  # [N/G], NaN with fewer than two rewards
    return std.nan_to_num(0.0) > 0


def select_groups(rollout: Rollout, scores: RewardScores, keep: Tensor) -> tuple[Rollout, RewardScores]:
    """The rows of the groups where ``keep`` [N/G] is True."""
    rows = keep.repeat_interleave(rollout.group_size).nonzero().squeeze(1)  # [n]
    picked = rows.tolist()
    kept = replace(
        rollout,
        prompt_ids=rollout.prompt_ids[rows],
        prompt_mask=rollout.prompt_mask[rows],
        completion_ids=rollout.completion_ids[rows],
        completion_mask=rollout.completion_mask[rows],
        is_truncated=rollout.is_truncated[rows],
        prompts=[rollout.prompts[i] for i in picked],
        completions=[rollout.completions[i] for i in picked],
        sampling_logps=None if rollout.sampling_logps is None else rollout.sampling_logps[rows],
        tool_mask=None if rollout.tool_mask is None else rollout.tool_mask[rows],
        columns={k: [v[i] for i in picked] for k, v in rollout.columns.items()},
    )
    return kept, replace(scores, per_function=scores.per_function[rows])


def _pad_to(t: Tensor, width: int, value: float, left: bool) -> Tensor:
    pad = t.new_full((t.shape[0], width - t.shape[1]), value)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def _cat(a: Tensor | None, b: Tensor | None, value: float, left: bool = False) -> Tensor | None:
    if a is None or b is None:
        if a is not None or b is not None:
            raise ValueError("generation batches to concatenate differ in which per-token fields they have")
        return None
    width = max(a.shape[1], b.shape[1])
    return torch.cat([_pad_to(a, width, value, left), _pad_to(b, width, value, left)])


def concat(a: Rollout, b: Rollout, pad_id: int) -> Rollout:
    """Two rollouts' rows in one, prompts re-padded on the left and completions on the right."""
    return replace(
        b,
        prompt_ids=_cat(a.prompt_ids, b.prompt_ids, pad_id, left=True),
        prompt_mask=_cat(a.prompt_mask, b.prompt_mask, 0, left=True),
        completion_ids=_cat(a.completion_ids, b.completion_ids, pad_id),
        completion_mask=_cat(a.completion_mask, b.completion_mask, 0),
        is_truncated=torch.cat([a.is_truncated, b.is_truncated]),
        prompts=a.prompts + b.prompts,
        completions=a.completions + b.completions,
        num_truncated_prompts=a.num_truncated_prompts + b.num_truncated_prompts,
        sampling_logps=_cat(a.sampling_logps, b.sampling_logps, 0.0),
        tool_mask=_cat(a.tool_mask, b.tool_mask, 0),
        columns={k: a.columns[k] + b.columns[k] for k in b.columns},
    )


@dataclass
class GroupBuffer:
    """Groups with signal gathered across generation batches, until an update's worth (one rank's)."""

    pad_id: int
    rollout: Rollout | None = None
    scores: RewardScores | None = None
    num_gen_batches: int = 0  # generation batches drawn since the last update
    groups_drawn: int = 0  # groups sampled since the last update, with signal or not

    @property
    def num_groups(self) -> int:
        return 0 if self.rollout is None else len(self.rollout) // self.rollout.group_size

    def add(self, rollout: Rollout, scores: RewardScores) -> None:
        """Keep the groups of a scored generation batch whose rewards differ."""
        self.num_gen_batches += 1
        self.groups_drawn += len(rollout) // rollout.group_size
        kept, kept_scores = select_groups(rollout, scores, groups_with_signal(scores.total, rollout.group_size))
        if self.rollout is None:
            self.rollout, self.scores = kept, kept_scores
            return
        self.rollout = concat(self.rollout, kept, self.pad_id)
        errors = {k: self.scores.errors.get(k, 0) + kept_scores.errors.get(k, 0) for k in kept_scores.errors}
        per_function = torch.cat([self.scores.per_function, kept_scores.per_function])
        self.scores = replace(kept_scores, per_function=per_function, errors=errors)

    def take(self, num_groups: int) -> tuple[Rollout, RewardScores, dict[str, float]]:
        """The first ``num_groups`` groups (surplus dropped, as verl does), the buffer's metrics, and a reset."""
        keep = torch.arange(self.num_groups) < num_groups
        rollout, scores = select_groups(self.rollout, self.scores, keep)
        metrics = {
            "filter_groups/num_gen_batches": float(self.num_gen_batches),
            "filter_groups/kept_fraction": self.num_groups / max(self.groups_drawn, 1),
        }
        self.rollout, self.scores, self.num_gen_batches, self.groups_drawn = None, None, 0, 0
        return rollout, scores, metrics

    def next_update(
        self, rollout: Rollout, scores: RewardScores, num_prompts: int, ranks: Ranks, cap: int | None, step: int
    ) -> tuple[Rollout, RewardScores, dict[str, float]] | None:
        """One scored generation batch in; an update's worth out (``num_prompts`` groups on every rank), or what
        there is once ``cap`` (``max_num_gen_batches``) batches were drawn; ``None`` while the buffer fills, or
        when after ``cap`` batches some rank has no group with signal (``step``: the global step, for warnings)."""
        self.add(rollout, scores)
        have = int(ranks.gather_rows(torch.tensor([self.num_groups], device=rollout.completion_ids.device)).min())
        if have >= num_prompts:
            return self.take(num_prompts)
        if not cap or self.num_gen_batches < cap:
            return None
        if have == 0:  # no signal at all: no update (the collapse alert's no_learning_signal also sees it)
            self.take(0)
            rank_zero_warn(
                f"filter_groups: {cap} generation batches (max_num_gen_batches) gave no group with differing "
                f"rewards on some rank; no update at global step {step}"
            )
            return None
        rank_zero_warn(
            f"filter_groups: after max_num_gen_batches={cap} generation batches only {have} of {num_prompts} "
            "groups per rank have differing rewards; updating on those. The prompts may be too easy or too hard"
        )
        return self.take(have)
