"""DAPO's dynamic sampling (arXiv:2503.14476; verl's ``algorithm.filter_groups``): groups whose rewards are all
equal carry no learning signal, so they are dropped, and the groups that remain are kept across generation
batches until there are enough for an update (counted on every rank). Bookkeeping over Rollouts and
RewardScores.

As in verl, the update waits (no optimiser step) while the buffer fills, takes the oldest groups first, and the
number of generation batches an update took is logged. Where we deviate:
- past ``max_num_gen_batches`` verl raises; we take the update on the groups there are (with a warning), so a hard
  stretch of the dataset slows training instead of ending it;
- verl drops the surplus groups once an update's worth is gathered. Ours are kept for the next update when an
  engine that samples ahead (``AsyncRollouts``) still allows their age there (``max_staleness``): sampled groups
  with signal are not thrown away, and their staleness stays bounded. From an in-process engine they would be
  one update stale with nothing to correct it, so they are dropped, as verl does. Both are logged.
- the buffer is saved in checkpoints (every rank's), so a run resumed mid-fill trains on the same groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_grpo.advantages import AdvantageConfig
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import DrawnBatch, RewardScores, Rollout, fields_of


def select_groups(rollout: Rollout, scores: RewardScores, keep: Tensor) -> tuple[Rollout, RewardScores]:
    """The rows of the groups where ``keep`` [N/G] is True."""
    rows = keep.repeat_interleave(rollout.group_size).nonzero().squeeze(1)  # [n]
    return rollout.select(rows), scores.select(rows)


@dataclass
class GroupBuffer:
    """Groups with signal gathered across generation batches, until an update's worth (one rank's)."""

    pad_id: int
    enabled: bool = True  # filter_groups; off, every generation batch is an update as it is
    cap: int | None = None  # max_num_gen_batches
    max_staleness: int = 0  # the rollout engine's bound: surplus groups within it at the next update are kept
    rollout: Rollout | None = None
    scores: RewardScores | None = None
    num_gen_batches: int = 0  # generation batches drawn since the last update
    groups_drawn: int = 0  # groups sampled since the last update, with signal or not
    groups_kept: int = 0  # of those, the groups with signal
    kept_everywhere: int = 0  # groups with signal in the last generation batch, every rank's

    @classmethod
    def of(cls, advantages: AdvantageConfig, pad_id: int, max_staleness: int = 0) -> GroupBuffer:
        """The buffer for the ``advantages:`` settings (``filter_groups``, ``max_num_gen_batches``) and the rollout
        engine's ``max_staleness``."""
        return cls(pad_id, advantages.filter_groups, advantages.max_num_gen_batches, max_staleness)

    @property
    def num_groups(self) -> int:
        return 0 if self.rollout is None else len(self.rollout) // self.rollout.group_size

    def add(self, rollout: Rollout, scores: RewardScores) -> int:
        """Keep the groups of a scored generation batch whose rewards differ; how many they are."""
        self.num_gen_batches += 1
        self.groups_drawn += len(rollout) // rollout.group_size
        keep = ~scores.groups_without_signal(rollout.group_size)
        count = int(keep.sum())
        self.groups_kept += count
        kept, kept_scores = select_groups(rollout, scores, keep)
        if self.rollout is None:
            self.rollout, self.scores = kept, kept_scores
            return count
        self.rollout = self.rollout.cat(kept, self.pad_id)
        errors = {k: self.scores.errors.get(k, 0) + kept_scores.errors.get(k, 0) for k in kept_scores.errors}
        per_function = torch.cat([self.scores.per_function, kept_scores.per_function])
        self.scores = replace(kept_scores, per_function=per_function, errors=errors)
        return count

    def take(self, num_groups: int, staleness: Tensor | None = None) -> tuple[Rollout, RewardScores, dict[str, float]]:
        """The first (oldest) ``num_groups`` groups and the buffer's metrics. The surplus stays for the next
        update where ``staleness`` ([N] of the buffer's rows: updates since their weights; ``None``: sampled by the
        current ones) plus this update is within ``max_staleness``; the rest is dropped, as verl drops it."""
        surplus = torch.arange(self.num_groups) >= num_groups
        carried = torch.zeros_like(surplus)  # none from an in-process engine
        if staleness is not None:
            carried = surplus & (staleness[:: self.rollout.group_size].cpu() + 1 <= self.max_staleness)
        rollout, scores = select_groups(self.rollout, self.scores, ~surplus)
        metrics = {
            "filter_groups/num_gen_batches": float(self.num_gen_batches),
            "filter_groups/kept_fraction": self.groups_kept / max(self.groups_drawn, 1),
            "filter_groups/carried_groups": float(carried.sum()),
            "filter_groups/dropped_groups": float((surplus & ~carried).sum()),
        }
        self.rollout, self.scores = select_groups(self.rollout, self.scores, carried) if carried.any() else (None, None)
        self.num_gen_batches, self.groups_drawn, self.groups_kept = 0, 0, 0
        return rollout, scores, metrics

    def next_update(
        self,
        rollout: Rollout,
        scores: RewardScores,
        num_prompts: int,
        ranks: Ranks,
        step: int,
        staleness: Callable[[Rollout], Tensor | None] = lambda rollout: None,
    ) -> tuple[Rollout, RewardScores, dict[str, float]] | None:
        """One scored generation batch in; an update's worth out (``num_prompts`` groups on every rank), or what
        there is once ``cap`` (``max_num_gen_batches``) batches were drawn; ``None`` while the buffer fills, or
        when after ``cap`` batches some rank has no group with signal (``step``: the global step, for warnings;
        ``staleness``: the rollout engine's, of a rollout's rows)."""
        if not self.enabled:
            return rollout, scores, {}
        cap = self.cap
        kept = self.add(rollout, scores)
        device = rollout.completion_ids.device
        counts = ranks.gather_rows(torch.tensor([[self.num_groups, kept]], device=device)).tolist()  # [W, 2]: one read
        have, self.kept_everywhere = min(c[0] for c in counts), sum(c[1] for c in counts)
        if have >= num_prompts:
            return self.take(num_prompts, staleness(self.rollout))
        if not cap or self.num_gen_batches < cap:
            return None
        if have == 0:  # no signal on some rank: no update (NoSignalAlert sees each such batch: ``drawn``)
            self.take(0, staleness(self.rollout))
            rank_zero_warn(
                f"filter_groups: {cap} generation batches (max_num_gen_batches) gave no group with differing "
                f"rewards on some rank; no update at global step {step}"
            )
            return None
        rank_zero_warn(
            f"filter_groups: after max_num_gen_batches={cap} generation batches only {have} of {num_prompts} "
            "groups per rank have differing rewards; updating on those. The prompts may be too easy or too hard"
        )
        return self.take(have, staleness(self.rollout))

    def drawn(self, rollout: Rollout, scores: RewardScores) -> DrawnBatch:
        """What the generation batch just added showed, for the callbacks, when it made no update."""
        return DrawnBatch(rollout, scores, self.kept_everywhere)

    # ---- checkpoints --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's groups waiting for an update and its counters, as dicts, lists and tensors."""
        return {
            "rollout": None if self.rollout is None else fields_of(self.rollout),
            "scores": None if self.scores is None else fields_of(self.scores),
            "counters": [self.num_gen_batches, self.groups_drawn, self.groups_kept],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollout = None if state["rollout"] is None else Rollout(**state["rollout"])
        self.scores = None if state["scores"] is None else RewardScores(**state["scores"])
        self.num_gen_batches, self.groups_drawn, self.groups_kept = state["counters"]
