"""A teacher's judgement of the student's tokens -> a distillation signal. Pure functions: no model, no trainer.

Two objectives, chosen by ``distill.objective``:
- ``reverse_kl``: on-policy distillation as Thinking Machines describe it (Lu et al., "On-Policy Distillation",
  2025; GKD arXiv:2306.13649 with beta = 1): the student samples, the teacher scores each sampled token, and the
  per-token reverse KL estimate ``log pi_student(y_t) - log pi_teacher(y_t)`` enters the policy gradient as a
  dense, undiscounted per-token advantage, negated: ``A_t = -(log pi_student(y_t) - log pi_teacher(y_t))``.
  Only the sampled tokens' log-probs are needed, so the teacher's run once per generation batch, like the
  reference's.
- ``gkd``: the generalised Jensen-Shannon divergence of GKD over the whole vocabulary at each completion
  position, equal to TRL 1.16's ``GKDTrainer.generalized_jsd_loss`` (value and gradient, every ``beta`` and
  reduction). Needs the student's and teacher's full logits.

The mix with rewards: ``A_t = reward_weight * A_reward + teacher_weight * A_t^distill`` (``mix_advantages``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_grpo.types import DistillStats

IGNORE_INDEX = -100  # TRL's label of a position outside the loss


@dataclass(frozen=True)
class Objective:
    dense_advantage: bool  # the teacher's judgement enters the advantages, computed once per generation batch
    needs_logits: bool  # a term over the whole vocabulary, computed with each micro-batch's forward


OBJECTIVES = {"reverse_kl": Objective(dense_advantage=True, needs_logits=False), "gkd": Objective(False, True)}


def generalized_jsd_tokens(student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float) -> Tensor:
    """[..., V] per-vocabulary-entry terms of GKD's generalised JSD (sum over the last dimension: the divergence).

    ``beta`` = 0 is the forward KL(teacher || student), 1 the reverse KL(student || teacher), in between the JSD
    against the mixture ``beta * teacher + (1 - beta) * student``; computed as TRL does (``F.kl_div`` on log
    probabilities, the mixture by ``logsumexp``), so values and gradients agree to rounding.
    """
    student = F.log_softmax(student_logits / temperature, dim=-1)  # [..., V]
    teacher = F.log_softmax(teacher_logits / temperature, dim=-1)  # [..., V]
    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True)
    b = torch.tensor(beta, dtype=student.dtype, device=student.device)
    mixture = torch.logsumexp(torch.stack([student + torch.log1p(-b), teacher + torch.log(b)]), dim=0)  # [..., V]
    kl_teacher = F.kl_div(mixture, teacher, reduction="none", log_target=True)
    kl_student = F.kl_div(mixture, student, reduction="none", log_target=True)
    return b * kl_teacher + (1 - b) * kl_student


def _batchmean(jsd: Tensor, mask: Tensor | None) -> Tensor:
    """Sum over the kept entries / kept positions (at least 1); without a mask, over the first dimension."""
    denom = mask.sum().clamp_min(1) if mask is not None else max(jsd.size(0), 1)
    return jsd.sum() / denom


JSD_REDUCTIONS: dict[str, Callable[[Tensor, Tensor | None], Tensor]] = {
    "batchmean": _batchmean,
    "sum": lambda jsd, mask: jsd.sum(),
    "mean": lambda jsd, mask: jsd.mean(),
    "none": lambda jsd, mask: jsd,
}


def generalized_jsd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    num_items_in_batch: int | Tensor | None = None,
) -> Tensor:
    """GKD's loss with TRL's signature and defaults (``GKDTrainer.generalized_jsd_loss``).

    Args:
        student_logits: [B, T, V] with gradient.
        teacher_logits: [B, T, V].
        labels: [B, T] ``-100`` where a position is outside the loss; ``None`` keeps all.
        beta: in [0, 1]; 0 forward KL, 1 reverse KL.
        temperature: both logits are divided by it.
        reduction: ``batchmean`` (sum / kept positions), ``sum``, ``mean`` (over every kept entry) or ``none``.
        num_items_in_batch: when given, sum / it, whatever ``reduction`` says (TRL: the global token count).
    """
    if reduction not in JSD_REDUCTIONS:
        raise ValueError(f"reduction must be one of {sorted(JSD_REDUCTIONS)}, got {reduction!r}")
    if not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    jsd = generalized_jsd_tokens(student_logits, teacher_logits, beta, temperature)  # [B, T, V]
    mask = None if labels is None else labels != IGNORE_INDEX  # [B, T]
    if mask is not None:
        jsd = jsd[mask]  # [kept, V]
    if num_items_in_batch is not None:
        total = jsd.sum()
        return total / (
            num_items_in_batch.to(total.device) if isinstance(num_items_in_batch, Tensor) else num_items_in_batch
        )
    return JSD_REDUCTIONS[reduction](jsd, mask)


def reverse_kl(student_logps: Tensor, teacher_logps: Tensor) -> Tensor:
    """[N, T] the one-sample estimate of KL(student || teacher) per sampled token: ``log p_s(y_t) - log p_t(y_t)``."""
    return student_logps - teacher_logps


def reverse_kl_advantages(student_logps: Tensor, teacher_logps: Tensor, mask: Tensor) -> Tensor:
    """[N, T] Thinking Machines' per-token advantage ``-(log p_student(y_t) - log p_teacher(y_t))``, 0 off the mask:
    positive where the teacher likes the sampled token more than the student does.

    >>> reverse_kl_advantages(torch.tensor([[-0.1, -2.0]]), torch.tensor([[-0.5, -0.5]]), torch.ones(1, 2))
    tensor([[-0.4000,  1.5000]])
    """
    return -reverse_kl(student_logps, teacher_logps) * mask


def mix_advantages(
    reward_adv: Tensor | None, distill_adv: Tensor, reward_weight: float, teacher_weight: float
) -> Tensor:
    """[N, T] ``reward_weight * reward_adv + teacher_weight * distill_adv``; a completion's advantage ([N]) is given
    to each of its tokens. ``reward_adv`` ``None`` (no reward functions) leaves the teacher's alone.

    >>> mix_advantages(torch.tensor([1.0]), torch.tensor([[0.5, -0.5]]), reward_weight=0.5, teacher_weight=2.0)
    tensor([[ 1.5000, -0.5000]])
    """
    mixed = teacher_weight * distill_adv  # [N, T]
    if reward_adv is None or reward_weight == 0:
        return mixed
    per_token = reward_adv if reward_adv.ndim == 2 else reward_adv.unsqueeze(-1)  # [N, T] or [N, 1]
    return mixed + reward_weight * per_token


def distill_stats(rkl: Tensor, mask: Tensor, top_agreement: float | None = None) -> DistillStats:
    """The reverse KL's mean and spread over the loss tokens (``rkl`` [N, T] per-token estimates), with the share of
    positions where student and teacher rank the same token first, when logits were compared."""
    kept = rkl[mask.bool()].double()  # [k]
    mean = float(kept.mean()) if kept.numel() else float("nan")
    std = float(kept.std(correction=0)) if kept.numel() else float("nan")
    return DistillStats(reverse_kl=mean, reverse_kl_std=std, tokens=int(kept.numel()), top_agreement=top_agreement)


def top_token_agreement(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(positions where the student's and teacher's most likely tokens agree, positions counted): summable over
    micro-batches and ranks. ``student_logits``/``teacher_logits`` [n, T, V], ``mask`` [n, T]."""
    same = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).to(mask.dtype) * mask  # [n, T]
    return same.sum().detach(), mask.sum().detach()
