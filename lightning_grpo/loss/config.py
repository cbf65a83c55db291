"""The ``loss:`` settings: every option of the GRPO-family loss, TRL 1.16's names and defaults. Checked once, here;
TRL's advice for combinations that run but depart from a paper's setup is a warning. (``distill:`` is
``distill/config.py``.)"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help
from lightning_grpo.loss.reduce import LOSS_TYPES

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@field_help
@dataclass(frozen=True)
class LossConfig:
    """Every option of the loss, with TRL 1.16's names and defaults. ``loss:`` in YAML."""

    loss_type: Literal[tuple(LOSS_TYPES)] = "dapo"
    """The policy term and its reduction (references/concepts.md, "Variants"); dapo, TRL's default: token mean
    over the global batch; grpo: sequence mean; bnpo; dr_grpo: constant length; luspo: length-scaled sequences;
    cispo: clipped IS weight, MiniMax-M1; sapo: soft gate; vespo."""
    beta: float = 0.0
    """Weight of the k3 KL to the reference; > 0 keeps a frozen reference (LoRA: the adapter switched off)."""
    epsilon: float = 0.2
    """Lower clip of the ratio, 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip, 1 + epsilon_high; ``None``: epsilon (DAPO: 0.28). cispo: the cap itself, >= 1."""
    delta: float | None = None
    """Cap on the unclipped ratio; > 1 + epsilon_high. Two-sided clipping (INTELLECT-2); ``None``: off."""
    importance_sampling_level: Literal[IMPORTANCE_SAMPLING_LEVELS] = "token"
    """token (GRPO) or sequence (GSPO)."""
    sapo_temperature_pos: float = 1.0
    """SAPO's gate temperature, advantage > 0."""
    sapo_temperature_neg: float = 1.05
    """SAPO's gate temperature, advantage <= 0."""
    vespo_k_pos: float = 2.0
    """VESPO's exponent, advantage >= 0."""
    vespo_lambda_pos: float = 3.0
    """VESPO's decay, advantage >= 0."""
    vespo_k_neg: float = 3.0
    """VESPO's exponent, advantage < 0."""
    vespo_lambda_neg: float = 2.0
    """VESPO's decay, advantage < 0."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2's off-policy mask; ``None``: off. Negative-advantage sequences whose mean log-ratio to the
    sampler exceeds it are left out."""
    use_bias_correction_kl: bool = True
    """KL times the importance ratio (DeepSeek-V3.2; TRL's default)."""
    top_entropy_quantile: float = 1.0
    """Train on this top fraction of tokens by entropy; 1.0: all. 0.2 in "Beyond the 80/20 rule". The threshold is
    the optimiser step's, over every rank (``targets.EntropyCut``), so micro-batches do not change it."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus; 0 disables it. The initial weight when adaptive."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1's adaptive bonus; entropy_coef moves by entropy_coef_delta each step towards entropy_target."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive weight."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive weight."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive weight."""
    entropy_target: float = 0.2
    """Nats; the adaptive bonus applies only while the trained tokens' entropy is at or below it."""
    router_aux_loss_coef: float | None = None
    """Mixture-of-Experts load-balancing weight. ``None`` takes the model config's ``router_aux_loss_coef`` (as
    TRL does); 0.0 leaves it out."""

    def __post_init__(self) -> None:
        raise_problems("loss", loss_checks(self))
        for advice in loss_advice(self):
            warnings.warn(advice, UserWarning, stacklevel=3)

    @property
    def clip_high(self) -> float:
        """``epsilon_high``, defaulting to ``epsilon`` as in TRL."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def loss_advice(c: LossConfig) -> list[str]:
    """TRL 1.16's warnings for combinations that run but depart from the paper's setup."""
    level = c.importance_sampling_level
    return [
        message
        for wrong, message in [
            (
                c.loss_type == "luspo" and level != "sequence",
                "loss_type 'luspo' scales a sequence-level loss: set importance_sampling_level 'sequence' to mirror "
                "the paper's setup (GSPO's ratio)",
            ),
            (
                level == "sequence" and c.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"),
                f"importance_sampling_level 'sequence' with loss_type {c.loss_type!r} sums per-token terms, so each "
                "sequence weighs by its length: GSPO's paper uses loss_type 'grpo'",
            ),
            (
                c.loss_type == "vespo" and level != "token",
                "loss_type 'vespo' computes sequence-level weights itself: importance_sampling_level should be "
                "'token' (the default)",
            ),
        ]
        if wrong
    ]


def loss_checks(c: LossConfig) -> list[tuple[bool, str]]:
    """(ok, message) for every option of ``c``, each message naming the option, the value and what is allowed."""
    clip_high = c.clip_high
    return [
        (c.loss_type in LOSS_TYPES, f"loss_type must be one of {sorted(LOSS_TYPES)}, got {c.loss_type!r}"),
        (
            c.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
            f"importance_sampling_level must be one of {list(IMPORTANCE_SAMPLING_LEVELS)}, "
            f"got {c.importance_sampling_level!r}",
        ),
        (c.beta >= 0, f"beta must be >= 0, got {c.beta!r}"),
        (0 <= c.epsilon < 1, f"epsilon must be in [0, 1), got {c.epsilon!r}"),
        (clip_high >= 0, f"epsilon_high must be >= 0, got {c.epsilon_high!r}"),
        (
            c.loss_type != "cispo" or clip_high >= 1,
            f"loss_type 'cispo' caps the ratio at epsilon_high itself and needs epsilon_high >= 1 "
            f"(MiniMax-M1 uses 5.0), got {clip_high!r}",
        ),
        (
            c.delta is None or c.delta > 1 + clip_high,
            f"delta must be None or > 1 + epsilon_high = {1 + clip_high}, got {c.delta!r}",
        ),
        (c.sapo_temperature_pos > 0, f"sapo_temperature_pos must be > 0, got {c.sapo_temperature_pos!r}"),
        (c.sapo_temperature_neg > 0, f"sapo_temperature_neg must be > 0, got {c.sapo_temperature_neg!r}"),
        (
            c.off_policy_mask_threshold is None or c.off_policy_mask_threshold >= 0,
            f"off_policy_mask_threshold must be >= 0 or None, got {c.off_policy_mask_threshold!r}",
        ),
        (
            0 <= c.top_entropy_quantile <= 1,
            f"top_entropy_quantile must be in [0, 1], got {c.top_entropy_quantile!r}",
        ),
        (
            c.entropy_coef_min <= c.entropy_coef_max,
            f"entropy_coef_min ({c.entropy_coef_min!r}) must be <= entropy_coef_max ({c.entropy_coef_max!r})",
        ),
        (c.entropy_coef_delta >= 0, f"entropy_coef_delta must be >= 0, got {c.entropy_coef_delta!r}"),
        (
            c.router_aux_loss_coef is None or c.router_aux_loss_coef >= 0,
            f"router_aux_loss_coef must be None or >= 0, got {c.router_aux_loss_coef!r}",
        ),
    ]
