"""A rollout + the teacher -> what on-policy distillation trains against: the teacher's log-probs of the sampled
tokens (once per generation batch, like the reference's), the dense reverse-KL advantage, and GKD's per-micro-batch
term; and, for GKD's off-policy share (``lmbda < 1``), the steps that train on the dataset's own completions in
place of the student's samples. The math is ``distill/loss.py``; the teacher is the Policy's
(``model/teacher.py``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from lightning_grpo.distill.config import DistillConfig
from lightning_grpo.distill.loss import (
    OBJECTIVES,
    distill_stats,
    generalized_jsd_tokens,
    reverse_kl,
    reverse_kl_advantages,
    top_token_agreement,
)
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.rollout import build_rollout, tokenized_prompts
from lightning_grpo.loss import LossNormalizer
from lightning_grpo.loss.reduce import at_least_one
from lightning_grpo.model.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import DistillStats, PromptBatch, Rollout, pad_rows


def no_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """0.0 for every completion: the reward of a run that learns from its teacher alone (no ``reward_funcs``)."""
    return [0.0] * len(completions)


@dataclass
class DistillTargets:
    """The teacher's judgement of one generation batch (N rows)."""

    config: DistillConfig
    teacher_logps: Tensor  # [N, T] the teacher's log-probs of the sampled tokens
    advantages: Tensor | None  # [N, T] reverse_kl: -(student - teacher) log-probs, before teacher_weight
    stats: DistillStats  # over every rank's loss tokens
    agreeing: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # gkd: positions whose top tokens agree
    compared: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # gkd: positions compared

    def loss(
        self, policy: Policy, rollout: Rollout, rows: slice | Tensor, mask: Tensor, norm: LossNormalizer
    ) -> Tensor:
        """gkd: ``teacher_weight`` times the generalised JSD of ``rows`` summed over their loss tokens ([n, T]
        ``mask``) / the batch's tokens per rank (DAPO's normaliser: micro-batches and ranks add up to the token
        mean; one micro-batch on one process is TRL's ``batchmean``). 0 for reverse_kl, whose signal is in the
        advantages."""
        c = self.config
        if not OBJECTIVES[c.objective].needs_logits:
            return torch.zeros((), device=mask.device)
        student, teacher = policy.distill_logits(rollout, rows)  # [n, T, V] each
        jsd = generalized_jsd_tokens(student, teacher.to(student.dtype), c.beta, c.temperature).sum(-1)  # [n, T]
        same, count = top_token_agreement(student, teacher, mask)
        self.agreeing, self.compared = self.agreeing + same.cpu(), self.compared + count.cpu()
        return c.teacher_weight * (jsd * mask).sum() / (at_least_one(norm.global_num_tokens) / norm.world_size)

    def settled(self, ranks: Ranks) -> DistillTargets:
        """After the update: gkd's top-token agreement over every rank's compared positions (a collective)."""
        if not OBJECTIVES[self.config.objective].needs_logits:
            return self
        compared = float(ranks.sum(self.compared))
        share = float(ranks.sum(self.agreeing)) / compared if compared else float("nan")
        return replace(self, stats=replace(self.stats, top_agreement=share))


def distill_targets(
    policy: Policy,
    rollout: Rollout,
    mask: Tensor,
    micro_batches: list[slice] | list[Tensor],
    student_logps: Tensor | None,
    config: DistillConfig,
    ranks: Ranks,
) -> DistillTargets:
    """The teacher's log-probs of the batch, and the student's reverse KL to it on the sampled tokens.

    Args:
        mask: [N, T] the loss tokens.
        student_logps: [N, T] the student's log-probs when already computed (the ``old_logps`` an off-policy step
            needs, or a sampler's that a correction checked: ``targets.build._student_logps``); ``None`` computes
            them (one no-grad forward).
    """
    teacher = policy.teacher_logps(rollout, micro_batches)  # [N, T]
    if student_logps is None:
        student_logps = policy.logps(rollout, micro_batches)
    student = torch.where(student_logps.isnan(), teacher, student_logps)  # a sampler with no log-prob: no signal
    per_token = reverse_kl(student, teacher) * mask  # [N, T]
    stats = distill_stats(ranks.gather_padded(per_token), ranks.gather_padded(mask))
    dense = OBJECTIVES[config.objective].dense_advantage
    advantages = reverse_kl_advantages(student, teacher, mask) if dense else None
    return DistillTargets(config, teacher, advantages, stats)


def off_policy_step(config: DistillConfig, seed: int, step: int, batch: PromptBatch) -> bool:
    """Whether this step trains on the dataset's completions (GKD's share ``1 - lmbda``, TRL's coin) rather than
    the student's samples. The coin depends on (seed, step) alone, so every rank flips it alike and a resumed run
    repeats it. Raises, before anything is generated, when ``lmbda < 1`` and the batch lacks the column."""
    if config.teacher is None or config.lmbda >= 1:
        return False
    if config.completion_column not in batch.columns:
        raise ValueError(
            f"distill.lmbda {config.lmbda} trains {1 - config.lmbda:.0%} of the steps on the dataset's completions, "
            f"but the data has no column {config.completion_column!r} (distill.completion_column); its columns: "
            f"{sorted(batch.columns)}. Add it, name another, or set distill.lmbda: 1.0"
        )
    return random.Random(seed * 1_000_003 + step).random() >= config.lmbda


def dataset_rollout(
    policy: Policy, batch: PromptBatch, column: str, group_size: int, sampling: SamplingConfig
) -> Rollout:
    """The batch's own completions (``column``: a text, or chat messages whose contents are the answer) as a
    Rollout of ``group_size`` copies of each: what GKD's off-policy steps train on. Each ends with the model's
    EOS and is cut to ``sampling.max_completion_length`` (truncated, as a sample would be)."""
    tokenizer, eos = policy.tokenizer, policy.eos_token_ids[0]
    prompt = tokenized_prompts(policy, batch.prompts, sampling)
    limit = sampling.max_completion_length
    answers = [_text_of(c) for c in batch.columns[column]]
    rows = [(tokenizer(a, add_special_tokens=False).input_ids + [eos])[:limit] for a in answers]
    completion_ids, _ = pad_rows([r for r in rows for _ in range(group_size)], tokenizer.pad_token_id, min_width=1)
    return build_rollout(
        tokenizer,
        batch.prompts,
        *prompt.repeated(group_size, policy.device),
        completion_ids.to(policy.device),
        policy.eos_token_ids,
        group_size,
        prompt.num_truncated,
    )


def _text_of(completion: str | list[dict]) -> str:
    """A completion column's value as text: a string, or the contents of its chat messages (TRL's conversational
    ``completion``: ``[{"role": "assistant", "content": ...}]``)."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion)
