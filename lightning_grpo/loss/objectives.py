"""Ratios and advantages -> per-token policy loss, one function per objective. Pure tensor math.

Each term returns the per-token loss ([n, T], or [n, 1] at sequence level) and per-token metric flags; ``loss/grpo.py``
masks, adds the KL and reduces. Papers and TRL 1.16 references are in ``loss/grpo.py``'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lightning_grpo.loss.config import LossConfig


@dataclass
class PolicyInputs:
    logps: Tensor  # [n, T] current log-probs, with grad
    log_ratio: Tensor  # [n, T] logps - old_logps, token level whatever importance_sampling_level says
    ratio: Tensor  # [n, T] or [n, 1] exp of the log-ratio at importance_sampling_level (TRL's coef_1)
    adv: Tensor  # [n, 1], or [n, T] for per-token advantages
    mask: Tensor  # [n, T]
    sampling_weights: Tensor | None  # [n, T] or [n, 1] sampler-mismatch weights (sampling_correction)


Term = tuple[Tensor, dict[str, Tensor]]  # per-token loss [n, T] or [n, 1]; metric name -> values to token-average


def clipped_surrogate(x: PolicyInputs, c: LossConfig) -> Term:
    """PPO's ``-min(r A, clip(r, 1 - eps, 1 + eps_high) A)``, ``r`` optionally capped at ``delta``."""
    clipped = x.ratio.clamp(1 - c.epsilon, 1 + c.clip_high)
    capped = x.ratio if c.delta is None else x.ratio.clamp(max=c.delta)
    low = (x.ratio < 1 - c.epsilon) & (x.adv < 0)
    high = (x.ratio > 1 + c.clip_high) & (x.adv > 0)
    flags = {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low | high}
    return -torch.min(capped * x.adv, clipped * x.adv), flags


def cispo_term(x: PolicyInputs, c: LossConfig) -> Term:
    """CISPO: REINFORCE with the ratio clipped and detached as a weight, ``-sg(min(r, eps_high)) A logp``."""
    weight = x.ratio.clamp(max=c.clip_high).detach()  # [n, T] or [n, 1]
    return -weight * x.adv * x.logps, {"cispo_clip_ratio": (x.ratio > c.clip_high) & (x.adv > 0)}


def sapo_term(x: PolicyInputs, c: LossConfig) -> Term:
    """SAPO: a smooth gate ``sigmoid(tau (r - 1)) 4 / tau`` instead of the hard clip; its slope at r = 1 is 1."""
    tau = torch.where(x.adv > 0, c.sapo_temperature_pos, c.sapo_temperature_neg)  # [n, 1]
    return -torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * x.adv, {}


@torch.no_grad()
def vespo_weights(x: PolicyInputs, c: LossConfig) -> Tensor:
    """[n, 1] VESPO's ``phi(w) = exp(lambda) w^k exp(-lambda w)`` (phi(1) = 1) of the sequence ratio ``w``.

    ``log w`` is the masked sum (not mean) of token log-ratios, plus the log sampling weights when given;
    clamps as TRL's ``get_gamma_weights`` (which follows the paper's code).
    """
    floor = math.log(1e-8)
    log_w = (x.log_ratio.clamp(-20.0, 20.0) * x.mask).sum(-1, keepdim=True)  # [n, 1]
    if x.sampling_weights is not None:
        log_w = log_w + x.sampling_weights.log().clamp(floor, 20.0).sum(-1, keepdim=True)
    log_w = log_w.clamp(floor, 20.0)
    nonneg = x.adv >= 0
    k = torch.where(nonneg, c.vespo_k_pos, c.vespo_k_neg)
    lam = torch.where(nonneg, c.vespo_lambda_pos, c.vespo_lambda_neg).clamp(min=1e-4)
    return (lam + k * log_w - lam * log_w.exp()).exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_term(x: PolicyInputs, c: LossConfig) -> Term:
    """VESPO: ``-phi(w) A logp`` with the detached gamma weight phi of the sequence ratio."""
    phi = vespo_weights(x, c)  # [n, 1]
    return -phi * x.adv * x.logps, {"vespo/phi_seq_mean": phi}
