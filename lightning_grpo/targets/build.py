"""A scored rollout -> what the loss is computed against: loss mask, advantages, normaliser, sampling-policy and
reference log-probs, sampler-correction weights, and the micro-batch slices. Each is computed once per generation
batch and serves every optimiser step on it: ``steps_per_generation`` steps, each on its share of the batch's
groups, repeated ``num_iterations`` times (TRL's order).

Knows the Policy (for log-probs), the advantage estimators and the rank collectives (every rank's rewards, the
global token count); nothing about how rewards were scored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lightning_grpo.advantages import AdvantageConfig, TokenRewards, kl_penalty, multi_objective_advantages
from lightning_grpo.distill.config import DistillConfig
from lightning_grpo.distill.loss import mix_advantages
from lightning_grpo.distill.targets import DistillTargets, distill_targets
from lightning_grpo.loss import LossConfig, LossNormalizer, LossOutput, grpo_loss
from lightning_grpo.model.logprobs import TokenLogps
from lightning_grpo.model.padding import forward_positions
from lightning_grpo.model.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.targets.config import UpdateConfig
from lightning_grpo.targets.correction import SamplerCorrection, correction_metrics, mismatch_stats
from lightning_grpo.types import MismatchStats, RewardScores, Rollout, StepStats


@dataclass(frozen=True)
class TargetSettings:
    """The settings that shape the targets: the ``update:`` and ``advantages:`` sections and what they need."""

    update: UpdateConfig
    advantages: AdvantageConfig
    group_size: int  # G
    max_completion_length: int  # Dr. GRPO's constant normaliser
    reference: bool  # reference log-probs are needed (loss.beta > 0 or advantages.kl_coef > 0)
    micro_batch_unit: int = 1  # rows a micro-batch keeps together: G for the shared-prompt forward
    distill: DistillConfig | None = None  # on-policy distillation from the Policy's teacher

    @property
    def needs_old_logps(self) -> bool:
        """The sampling policy's log-probs serve off-policy steps and REINFORCE++'s KL-in-reward."""
        a = self.advantages
        return self.update.off_policy or (a.token_level and a.kl_coef > 0)


@dataclass
class ProximalCorrection:
    """The sampler correction when every row is trained once, on the weights that start its generation batch (no
    step is off-policy): the proximal policy is then the one being trained, so its log-probs are the training
    forward's own, detached, and each micro-batch's weights are computed from them. This saves the separate no-grad
    forward that TRL (``vllm_importance_sampling_correction``) and verl (``old_log_prob``) make; the values are the
    same. The mismatch is measured once the update has seen every row (``Targets.settled``)."""

    correction: SamplerCorrection  # without weights (off, bypass) the log-probs serve the mismatch metrics only
    logps: Tensor  # [N, T] the proximal log-probs, filled one micro-batch at a time
    weights: Tensor | None = None  # [N, T] or [N, 1], likewise

    def weights_of(self, logps: Tensor, sampling_logps: Tensor, mask: Tensor, rows: slice | Tensor) -> Tensor | None:
        proximal = logps.detach()
        self.logps[rows] = proximal.to(self.logps.dtype)
        weights = self.correction.weights(proximal, sampling_logps, mask)
        if weights is None:
            return None
        if self.weights is None:
            self.weights = weights.new_ones(self.logps.shape[0], weights.shape[1])
        self.weights[rows] = weights
        return weights


@dataclass(frozen=True)
class Targets:
    """What every optimiser step on one generation batch is computed against (N rows each)."""

    advantages: Tensor  # [N] or [N, T]
    mask: Tensor  # [N, T] tokens in the loss: the model's own, up to EOS, less dropped truncated completions
    normalizer: LossNormalizer
    micro_batches: list[slice]  # row slices of one forward/backward pass each
    old_logps: Tensor | None  # [N, T] the sampling policy's, when some step is off-policy
    ref_logps: Tensor | None  # [N, T] when a reference is needed
    sampling_weights: Tensor | None  # [N, T] or [N, 1] when another engine sampled (vLLM)
    sampling_logps: Tensor | None = None  # [N, T] that engine's own log-probs (the off-policy mask compares them)
    mismatch: MismatchStats | None = None  # sampler vs trainer log-probs over every rank's loss tokens
    row_lengths: list[tuple[int, int]] | None = None  # [N] each row's real (prompt, completion) tokens (budget plans)
    proximal: ProximalCorrection | None = None  # the correction, when it is taken from the training forward
    distill: DistillTargets | None = None  # the teacher's judgement of the batch (``distill:``)
    tokens: tuple[int, int] | None = None  # positions one log-prob pass over the micro-batches runs; N x (P + T)
    # [2] bool on the device, the same on every rank: some rank's rewards are infinite, some rank's advantages are
    # not finite. Read with the first optimiser step's gradient check (``module``), not on their own.
    faults: Tensor | None = None

    def loss(
        self,
        token: TokenLogps,
        rows: slice | Tensor,
        norm: LossNormalizer,
        config: LossConfig,
        entropy_coef: float,
        cut: EntropyCut | None = None,
    ) -> LossOutput:
        """The loss of ``rows`` from the policy's log-probs of them (``token``), normalised by ``norm``; ``cut``:
        the optimiser step's entropy threshold (``top_entropy_quantile``), else the micro-batch's own."""
        weights, old = rows_of(self.sampling_weights, rows), rows_of(self.old_logps, rows)
        threshold = None if cut is None else cut.threshold
        norm = norm if cut is None else replace(norm, num_trained_tokens=cut.trained_tokens)
        if self.proximal is not None:
            weights = self.proximal.weights_of(token.logps, self.sampling_logps[rows], self.mask[rows], rows)
        if old is not None:  # where a sampler gave no log-prob (NaN; the bypass anchor), the ratio is 1
            old = torch.where(old.isnan(), token.logps.detach(), old)
        return grpo_loss(
            token.logps,
            old,
            self.advantages[rows],
            self.mask[rows],
            config,
            ref_logps=rows_of(self.ref_logps, rows),
            normalizer=norm,
            sampling_weights=weights,
            sampling_logps=rows_of(self.sampling_logps, rows),
            entropies=token.entropy,
            entropy_threshold=threshold,
            entropy_coef=entropy_coef,
        )

    def typed(self, stats: StepStats) -> StepStats:
        """``stats`` with the targets' own typed parts (the sampler mismatch, distillation's), for the alerts."""
        return replace(stats, mismatch=self.mismatch, distill=None if self.distill is None else self.distill.stats)

    def distill_loss(self, policy: Policy, rollout: Rollout, rows: slice | Tensor, norm: LossNormalizer) -> Tensor:
        """The teacher's term of the loss of ``rows`` (gkd); 0 without one or when its signal is in the
        advantages (reverse_kl)."""
        if self.distill is None:
            return torch.zeros((), device=self.mask.device)
        return self.distill.loss(policy, rollout, rows, self.mask[rows], norm)

    def settled(self, ranks: Ranks) -> Targets:
        """After the update: a correction taken from the training forward has its weights and mismatch, and gkd
        its top-token agreement (collectives: every rank logs and alerts alike)."""
        done = self if self.distill is None else replace(self, distill=self.distill.settled(ranks))
        c = done.proximal
        if c is None:
            return done
        mismatch = _mismatch(c.logps, done.sampling_logps, done.mask, ranks, c.correction.anchored)
        return replace(done, sampling_weights=c.weights, mismatch=mismatch, proximal=None)

    def metrics(self) -> dict[str, float]:
        """The sampler correction's range over the loss tokens and the sampler/trainer mismatch (``sampling/*``;
        none when the policy sampled)."""
        mismatch = self.mismatch.metrics() if self.mismatch is not None else {}
        distill = self.distill.stats.metrics() if self.distill is not None else {}
        return correction_metrics(self.sampling_weights, self.mask) | mismatch | distill | self.token_metrics()

    def token_metrics(self) -> dict[str, float]:
        """This rank's ``tokens/computed`` by one log-prob pass over the batch (its micro-batches, in the policy's
        layout), against ``tokens/padded``: N x (P + T), the batch as one padded pass; ``tokens/padding_saved``: the
        share of those positions never computed."""
        if self.tokens is None or not self.tokens[1]:  # no rows
            return {}
        computed, padded = self.tokens
        return {"tokens/computed": computed, "tokens/padded": padded, "tokens/padding_saved": 1 - computed / padded}


@dataclass(frozen=True)
class EntropyCut:
    """``loss.top_entropy_quantile``'s threshold, taken once per optimiser step over its rows on every rank (as TRL
    takes it over a micro-batch on every rank), so that no micro-batch split changes which tokens train."""

    threshold: Tensor  # scalar entropy: tokens at or above it train
    trained_tokens: Tensor  # this rank's loss tokens of the step at or above it: the entropy bonus's normaliser


def micro_batches(n: int, size: int | None) -> list[slice]:
    """Row slices of ``size`` (the last may be shorter); ``None`` is one slice of all ``n`` rows.

    >>> micro_batches(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    size = size or n
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def token_micro_batches(lengths: list[tuple[int, int]], budget: int, unit: int = 1) -> list[Tensor]:
    """[k] row indices (host tensors) of each micro-batch: units of ``unit`` consecutive rows, longest first,
    filled while the micro-batch's padded size stays within ``budget``; a longer unit goes alone. ``lengths`` [n]
    are each row's (prompt, completion) tokens; the padded forward holds its rows x (longest prompt + longest
    completion), which a long prompt beside a long completion makes up to twice the longest row. Planned on the
    host, from lengths read once (``Rollout.host``).

    >>> [m.tolist() for m in token_micro_batches([(0, 3), (1, 8), (0, 4), (2, 6), (1, 1), (0, 2)], budget=16)]
    [[1], [3, 2], [0, 4, 5]]
    >>> [m.tolist() for m in token_micro_batches([(8, 1), (1, 8)], budget=18)]  # 2 x (8 + 8) = 32 > 18
    [[0], [1]]
    """
    spans = [lengths[i : i + unit] for i in range(0, len(lengths), unit)]
    units = [(max(p for p, _ in s), max(c for _, c in s)) for s in spans]  # [U] each unit's longest prompt, completion
    batches: list[list[int]] = []
    prompt = completion = 0  # the last micro-batch's longest prompt and completion
    for u in sorted(range(len(units)), key=lambda u: -sum(units[u])):  # stable: ties keep their order
        rows = list(range(u * unit, (u + 1) * unit))
        p, c = max(prompt, units[u][0]), max(completion, units[u][1])
        if batches and (len(batches[-1]) + unit) * (p + c) <= budget:
            batches[-1] += rows
            prompt, completion = p, c
        else:
            batches.append(rows)
            prompt, completion = units[u]
    return [torch.tensor(b, dtype=torch.long) for b in batches]


def split_rows(lengths: list[tuple[int, int]], u: UpdateConfig, unit: int, ranks: Ranks) -> list[slice] | list[Tensor]:
    """The micro-batches of rows of ``lengths`` [n] (prompt, completion) tokens each, as ``update`` sets them; by
    tokens, as many on every rank (a collective): each forward and backward pass is one under DDP and FSDP2."""
    if u.token_budget is None:
        return micro_batches(len(lengths), u.micro_batch_size)
    batches = token_micro_batches(lengths, u.token_budget, unit)
    count = ranks.most(len(batches))
    return micro_batches(len(lengths), None) if count == 1 else split_to(batches, count, unit)


def split_to(batches: list[Tensor], count: int, unit: int) -> list[Tensor]:
    """``batches`` of whole units, the one with most rows split in two until there are ``count``. Every rank has as
    many units, so no rank is asked for more micro-batches than it has units.

    >>> [b.tolist() for b in split_to([torch.tensor([4, 5, 6, 7]), torch.tensor([0, 1])], 4, unit=1)]
    [[4], [5], [6, 7], [0, 1]]
    """
    batches = list(batches)
    while len(batches) < count:
        i = max(range(len(batches)), key=lambda j: len(batches[j]))
        big = batches.pop(i)
        half = (len(big) // unit + 1) // 2 * unit  # rows of the first half: whole units, at least one
        batches[i:i] = [big[:half], big[half:]]
    return batches


def rows_of(t: Tensor | None, rows: slice | Tensor) -> Tensor | None:
    return None if t is None else t[rows]


def loss_mask(completion_mask: Tensor, is_truncated: Tensor, mask_truncated_completions: bool) -> Tensor:
    """[N, T] tokens that count in the loss: DAPO drops completions that never emitted EOS."""
    if not mask_truncated_completions:
        return completion_mask
    return completion_mask * (~is_truncated).unsqueeze(1).to(completion_mask.dtype)


def normalizer(mask: Tensor, ranks: Ranks, max_completion_length: int) -> LossNormalizer:
    """Token and sequence counts of the generation batch, local and over every rank (a collective); the token
    counts stay on the device (the losses divide by them there)."""
    tokens = mask.sum().float()
    return LossNormalizer(
        num_sequences=mask.shape[0],
        num_tokens=tokens,
        global_num_tokens=ranks.sum(tokens),
        world_size=ranks.world_size,
        max_completion_length=max_completion_length,
    )


def build_targets(
    policy: Policy, rollout: Rollout, scores: RewardScores, every_rank: Tensor, s: TargetSettings, ranks: Ranks
) -> Targets:
    """Everything the step's optimiser steps are computed against, each computed once.

    Args:
        scores: this rank's scores (their weights apply to every rank's).
        every_rank: [W*N, F] every rank's per-function scores, in rank order: a batch std is global.
    """
    u = s.update
    mask = loss_mask(rollout.model_mask, rollout.is_truncated, u.mask_truncated_completions)  # [N, T]
    row_lengths = rollout.host.lengths  # [N]
    rows = split_rows(row_lengths, u, s.micro_batch_unit, ranks)
    old_logps = policy.logps(rollout, rows) if s.needs_old_logps else None
    ref_logps = policy.reference_logps(rollout, rows) if s.reference else None
    weights, proximal, mismatch, anchor = None, None, None, old_logps if u.off_policy else None
    if rollout.sampling_logps is not None:  # another engine sampled: corrected, and measured even when it is not
        c = u.correction
        anchor = rollout.sampling_logps if c.anchored else anchor  # bypass: the sampler anchors the ratio and clip
        if old_logps is not None:
            weights = c.weights(old_logps, rollout.sampling_logps, mask)
            mismatch = _mismatch(old_logps, rollout.sampling_logps, mask, ranks, c.anchored)
        else:  # every row trained once, from the weights that start the batch: the training forward's log-probs
            proximal = ProximalCorrection(c, torch.zeros_like(rollout.sampling_logps))
    advantages, distill = _advantages(every_rank, scores.weights, mask, old_logps, ref_logps, s, ranks), None
    if s.distill is not None:
        distill = distill_targets(policy, rollout, mask, rows, _student_logps(rollout, old_logps, u), s.distill, ranks)
        advantages = _with_teacher(advantages, distill, s.distill)
    faults = torch.stack([every_rank.isinf().any(), ~advantages.isfinite().all()])  # NaN rewards: not applicable
    return Targets(
        advantages=advantages,
        mask=mask,
        normalizer=normalizer(mask, ranks, s.max_completion_length),
        micro_batches=rows,
        old_logps=anchor,  # None: every step on-policy, the ratio is exactly 1
        ref_logps=ref_logps,
        sampling_weights=weights,
        sampling_logps=rollout.sampling_logps,
        mismatch=mismatch,
        row_lengths=row_lengths,
        proximal=proximal,
        distill=distill,
        tokens=(computed_positions(policy, rollout, rows), rollout.attention_mask.numel()),
        faults=ranks.sum(faults.float()) > 0,
    )


def computed_positions(policy: Policy, rollout: Rollout, rows: list[slice] | list[Tensor]) -> Tensor:
    """Token positions the decoder runs in one log-prob pass over ``rows``' micro-batches, in the policy's layout."""
    share, packed, width = policy.shares_prompt_prefix, policy.config.padding_free, rollout.completion_ids.shape[1]
    ids, mask = rollout.input_ids, rollout.attention_mask
    return sum(forward_positions(ids[r], mask[r], width, share, packed) for r in rows)


def _student_logps(rollout: Rollout, old_logps: Tensor | None, u: UpdateConfig) -> Tensor | None:
    """[N, T] the student's log-probs of the sampled tokens, for the teacher's reverse KL: the trainer's own when they
    were computed; else the sampler's where a correction is on, as the engine then checked them to be the trainer's
    distribution (``engines/vllm/logprobs.py``: unfiltered, at the sampling temperature); else ``None``: computed by
    a no-grad forward. With the correction off nothing checks them: a vLLM sampler's processed log-probs under a
    top-k/top-p filter are renormalised over the kept mass, so they would shift every advantage by its log."""
    if old_logps is not None or u.sampling_correction is None:
        return old_logps
    return rollout.sampling_logps


def _with_teacher(advantages: Tensor, distill: DistillTargets, c: DistillConfig) -> Tensor:
    """The rewards' advantages weighted by ``reward_weight``, plus ``teacher_weight`` times the teacher's dense
    advantage (reverse_kl: [N, T]); gkd's signal is a loss term, so only the rewards' weight applies here."""
    if distill.advantages is None:
        return c.reward_weight * advantages
    return mix_advantages(advantages, distill.advantages, c.reward_weight, c.teacher_weight)


def _mismatch(
    old_logps: Tensor, sampling_logps: Tensor, mask: Tensor, ranks: Ranks, anchored: bool
) -> MismatchStats | None:
    """The mismatch over every rank's loss tokens (a collective), so that every rank logs and alerts alike."""
    stats = mismatch_stats(*(ranks.gather_padded(t) for t in (old_logps, sampling_logps, mask)))
    return stats if stats is None else replace(stats, anchored=anchored)


def _advantages(
    every_rank: Tensor,
    weights: Tensor,
    mask: Tensor,
    old_logps: Tensor | None,
    ref_logps: Tensor | None,
    s: TargetSettings,
    ranks: Ranks,
) -> Tensor:
    """This rank's advantages ([N], or [N, T] for REINFORCE++'s token returns) from every rank's rewards."""
    a, tokens = s.advantages, None
    if a.token_level:  # batch whitening is global: every rank's tokens are gathered
        kl = kl_penalty(old_logps, ref_logps, a.kl_penalty) if a.kl_coef > 0 else None
        kl = None if kl is None else ranks.gather_padded(kl)
        tokens = TokenRewards(ranks.gather_padded(mask), kl, a.kl_coef, a.gamma)
    out = multi_objective_advantages(
        every_rank,
        weights.to(every_rank),
        s.group_size,
        a.multi_objective_aggregation,
        a.scale_rewards,
        a.adv_estimator,
        tokens,
    ).advantages
    out = ranks.own_rows(out)
    return out[:, : mask.shape[1]] if out.ndim == 2 else out
