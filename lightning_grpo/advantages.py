"""Rewards -> advantages. Pure tensor math: knows nothing of models, ranks or logging.

An estimator is one entry of ``ADV_ESTIMATORS`` (verl's ``adv_estimator`` names):
- ``grpo`` (arXiv:2402.03300): each completion against the others of its prompt,
  ``A = (r - mean_group(r)) / (std + 1e-4)``. The std is the group's (``scale_rewards="group"``, default), the
  whole batch's (``"batch"``), or not used (``"none"``, Dr. GRPO arXiv:2503.20783). Unbiased (n - 1), as in TRL.
- ``rloo`` (arXiv:2402.14740): the mean of the *other* completions of the group as baseline,
  ``A_i = r_i - mean_{j != i} r_j = G / (G - 1) (r_i - mean_group(r))``; no std scaling (verl's
  ``compute_rloo_outcome_advantage``).
- ``reinforce_plus_plus`` (arXiv:2501.03262): no group baseline; per-token returns (the reward at the last token
  minus ``kl_coef * KL`` at every token, summed to the end with discount ``gamma``), whitened over every token of
  the batch (verl's ``compute_reinforce_plus_plus_outcome_advantage`` with ``use_kl_in_reward``): [N, T]. Tokens
  out of the loss inside a completion (tool replies of a multi-turn episode) carry the return back to the earlier
  turns and take no discount step (verl resets the return at every masked token, so its outcome reward reaches
  only the last turn; the same as verl on single-turn rows).
- ``reinforce_plus_plus_baseline``: the group mean of the (KL-penalised) sequence reward as baseline, then the
  same batch whitening (verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``): [N, T].

Several reward functions combine by ``multi_objective_aggregation`` as in TRL 1.16: ``sum_then_normalize`` (the
weighted sum is the reward) or ``normalize_then_sum`` (GDPO, arXiv:2601.05242: each function normalised within
its group, weighted sum, then normalised over the batch).

A NaN reward (every function returned None) gets advantage 0 and is left out of every mean and std. Where we
deviate: verl has no NaN rewards; our ``rloo`` gives a group's only valid completion advantage 0 (verl would
pass its raw reward through for a group of one), and ``scale_rewards`` applies to ``grpo`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_grpo.checks import raise_problems
from lightning_grpo.docstrings import field_help
from lightning_grpo.types import nanstd, weighted_total

SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
STD_EPS = 1e-4  # TRL's constant: keeps a near-constant group from blowing up
WHITEN_EPS = 1e-8  # verl's masked_whiten


@field_help
@dataclass(frozen=True)
class AdvantageConfig:
    """How rewards become advantages. ``advantages:`` in YAML; TRL's names, verl's for what TRL lacks."""

    adv_estimator: Literal[tuple(ADV_ESTIMATORS)] = "grpo"
    """The baseline, verl's names; grpo: the group's mean (TRL); rloo: leave-one-out; reinforce_plus_plus:
    batch-whitened returns; reinforce_plus_plus_baseline: the group's mean, then batch whitening."""
    scale_rewards: Literal[SCALE_REWARDS] = "group"
    """grpo's std normalisation; group: each group's std; batch: the batch's std; none: Dr. GRPO."""
    multi_objective_aggregation: Literal[MULTI_OBJECTIVE_AGGREGATIONS] = "sum_then_normalize"
    """How several reward functions combine; sum_then_normalize: their weighted sum is the reward;
    normalize_then_sum: GDPO, each normalised in its group, then summed."""
    kl_coef: float = 0.0
    """REINFORCE++'s KL in the reward; 0 leaves it out. Each token's return is penalised by kl_coef * KL(policy ||
    reference) (verl's use_kl_in_reward with kl_ctrl.kl_coef). Needs a reference (> 0 keeps one, as loss.beta
    does)."""
    kl_penalty: Literal[tuple(KL_PENALTIES)] = "kl"
    """The KL estimator of that penalty, verl's ``algorithm.kl_penalty``; kl (k1, verl's default), abs, mse (k2) or
    low_var_kl (k3, clamped to [-10, 10])."""
    gamma: float = 1.0
    """REINFORCE++'s discount of the per-token returns."""
    filter_groups: bool = False
    """DAPO's dynamic sampling (verl's filter_groups). Groups whose rewards are all equal carry no signal and are
    dropped; generation batches are added until the batch has its prompts' worth of groups with signal, then one
    update is taken on them. Refused beside a ``distill.teacher``, whose signal is in every group."""
    max_num_gen_batches: int = 10
    """Most generation batches drawn for one update with filter_groups; 0: no limit. Then the update takes the
    groups it has (with a warning)."""

    def __post_init__(self) -> None:
        a = self
        raise_problems(
            "advantages",
            [
                (
                    a.adv_estimator in ADV_ESTIMATORS,
                    f"advantages.adv_estimator must be one of {sorted(ADV_ESTIMATORS)}, got {a.adv_estimator!r}",
                ),
                (
                    a.scale_rewards in SCALE_REWARDS,
                    f"advantages.scale_rewards must be one of {list(SCALE_REWARDS)}, got {a.scale_rewards!r}",
                ),
                (
                    a.multi_objective_aggregation in MULTI_OBJECTIVE_AGGREGATIONS,
                    f"advantages.multi_objective_aggregation must be one of {list(MULTI_OBJECTIVE_AGGREGATIONS)}, "
                    f"got {a.multi_objective_aggregation!r}",
                ),
                (
                    a.multi_objective_aggregation == "sum_then_normalize" or a.adv_estimator == "grpo",
                    "advantages.multi_objective_aggregation 'normalize_then_sum' (GDPO) works with adv_estimator "
                    f"'grpo' only, got {a.adv_estimator!r}",
                ),
                (a.kl_coef >= 0, f"advantages.kl_coef must be >= 0, got {a.kl_coef!r}"),
                (
                    a.kl_coef == 0 or a.adv_estimator.startswith("reinforce_plus_plus"),
                    f"advantages.kl_coef={a.kl_coef} puts the KL in the reward of reinforce_plus_plus* estimators "
                    f"only, got adv_estimator {a.adv_estimator!r}: use loss.beta for a KL loss",
                ),
                (
                    a.kl_penalty in KL_PENALTIES,
                    f"advantages.kl_penalty must be one of {sorted(KL_PENALTIES)}, got {a.kl_penalty!r}",
                ),
                (0 < a.gamma <= 1, f"advantages.gamma must be in (0, 1], got {a.gamma!r}"),
                (
                    a.max_num_gen_batches >= 0,
                    f"advantages.max_num_gen_batches must be >= 0, got {a.max_num_gen_batches!r}",
                ),
            ],
        )

    @property
    def token_level(self) -> bool:
        """Whether the estimator gives one advantage per token ([N, T]) and needs the completion mask."""
        return self.adv_estimator.startswith("reinforce_plus_plus")


@dataclass
class Advantages:
    advantages: Tensor  # [N], or [N, T] for token-level estimators; 0 where the reward was NaN


@dataclass
class TokenRewards:
    """What token-level estimators (REINFORCE++) need besides the sequence rewards."""

    mask: Tensor  # [N, T] 1 on completion tokens
    kl: Tensor | None = None  # [N, T] per-token KL of the sampling policy to the reference (``kl_penalty``)
    kl_coef: float = 0.0  # verl's ``kl_ctrl.kl_coef`` with ``use_kl_in_reward``: the KL goes into the reward
    gamma: float = 1.0  # discount of the returns


# ---- KL placed in the reward (REINFORCE++) ------------------------------------------------------------------

KL_PENALTIES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {  # verl's ``kl_penalty`` estimators of KL(pi || ref)
    "kl": lambda logp, ref: logp - ref,  # k1
    "abs": lambda logp, ref: (logp - ref).abs(),
    "mse": lambda logp, ref: 0.5 * (logp - ref) ** 2,  # k2
    "low_var_kl": lambda logp, ref: ((ref - logp).exp() - (ref - logp) - 1).clamp(-10, 10),  # k3
}


def kl_penalty(logps: Tensor, ref_logps: Tensor, kind: str = "kl") -> Tensor:
    """[N, T] per-token KL estimate of the sampling policy (``old_logps``) to the reference, for ``TokenRewards``."""
    if kind not in KL_PENALTIES:
        raise ValueError(f"kl_penalty must be one of {sorted(KL_PENALTIES)}, got {kind!r}")
    return KL_PENALTIES[kind](logps, ref_logps)


# ---- estimators: float64 rewards [N] -> advantages [N] or [N, T] ----------------------------------------------


def grpo_estimator(rewards: Tensor, group_size: int, scale_rewards: str, tokens: TokenRewards | None) -> Tensor:
    grouped = rewards.view(-1, group_size)  # [N/G, G]
    advantages = (grouped - grouped.nanmean(dim=1, keepdim=True)).view(-1)  # [N]
    if scale_rewards == "none":
        return advantages
    return advantages / (_reward_std(rewards, group_size, scale_rewards) + STD_EPS)


def rloo_estimator(rewards: Tensor, group_size: int, scale_rewards: str, tokens: TokenRewards | None) -> Tensor:
    grouped = rewards.view(-1, group_size)  # [N/G, G]
    count = (~grouped.isnan()).sum(dim=1, keepdim=True)  # [N/G, 1] valid completions
    others_mean = (grouped.nansum(dim=1, keepdim=True) - grouped) / (count - 1)  # [N/G, G] leave-one-out baseline
    return torch.where(count > 1, grouped - others_mean, torch.nan).view(-1)  # [N]


def reinforce_pp_estimator(rewards: Tensor, group_size: int, scale_rewards: str, tokens: TokenRewards | None) -> Tensor:
    t = _need_tokens(tokens, "reinforce_plus_plus")
    mask = t.mask.double()  # [N, T]
    token_rewards = -t.kl_coef * _kl(t) * mask  # [N, T] the KL penalty on every token ...
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)  # [N, T] ... and the score on the last
    token_rewards = token_rewards + last * rewards.nan_to_num(0.0).unsqueeze(-1)
    returns = torch.zeros_like(token_rewards)  # [N, T]
    running = torch.zeros_like(rewards)  # [N] 0 through the padding after the last loss token
    for i in reversed(range(mask.shape[1])):
        # a token out of the loss inside the completion (a tool reply in a multi-turn episode) passes the return
        # on to the model's earlier turns, undiscounted: the outcome reward reaches every turn
        running = torch.where(mask[:, i] > 0, token_rewards[:, i] + t.gamma * running, running)
        returns[:, i] = running
    return _whiten(returns, mask * ~rewards.isnan().unsqueeze(-1))


def reinforce_pp_baseline_estimator(
    rewards: Tensor, group_size: int, scale_rewards: str, tokens: TokenRewards | None
) -> Tensor:
    t = _need_tokens(tokens, "reinforce_plus_plus_baseline")
    mask = t.mask.double()  # [N, T]
    scores = rewards - t.kl_coef * (_kl(t) * mask).sum(-1)  # [N] the KL-penalised sequence reward
    grouped = scores.view(-1, group_size)  # [N/G, G]
    centred = (grouped - grouped.nanmean(dim=1, keepdim=True)).view(-1, 1) * mask  # [N, T]
    return _whiten(centred, mask * ~rewards.isnan().unsqueeze(-1))


ADV_ESTIMATORS: dict[str, Callable[[Tensor, int, str, TokenRewards | None], Tensor]] = {
    "grpo": grpo_estimator,
    "rloo": rloo_estimator,
    "reinforce_plus_plus": reinforce_pp_estimator,
    "reinforce_plus_plus_baseline": reinforce_pp_baseline_estimator,
}


def _reward_std(rewards: Tensor, group_size: int, scale_rewards: str) -> Tensor:
    """[N] std each reward is scaled by: its group's, or the batch's."""
    if scale_rewards == "batch":
        return nanstd(rewards).expand_as(rewards)
    return nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)


def _whiten(values: Tensor, mask: Tensor) -> Tensor:
    """[N, T] ``(x - mean) / sqrt(var + 1e-8)`` over the masked tokens (unbiased var, verl's ``masked_whiten``)."""
    count = mask.sum()
    mean = (values * mask).sum() / count
    var = (((values - mean) ** 2) * mask).sum() / (count - 1)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def _kl(t: TokenRewards) -> Tensor:
    return torch.zeros_like(t.mask, dtype=torch.float64) if t.kl is None else t.kl.double().nan_to_num(0.0)


def _need_tokens(tokens: TokenRewards | None, estimator: str) -> TokenRewards:
    if tokens is None:
        raise ValueError(f"adv_estimator {estimator!r} works on tokens: pass tokens=TokenRewards(mask, kl, kl_coef)")
    return tokens


# ---- entry points -------------------------------------------------------------------------------------------


def compute_advantages(
    rewards: Tensor,
    group_size: int,
    scale_rewards: str = "group",
    adv_estimator: str = "grpo",
    tokens: TokenRewards | None = None,
) -> Advantages:
    """Advantages of N completions in groups of G consecutive rows.

    Args:
        rewards: [N] total reward per completion; NaN means no function applied (advantage 0).
        group_size: G, completions per prompt.
        scale_rewards: "group", "batch" or "none" (``grpo`` only; see module docstring).
        adv_estimator: one of ``ADV_ESTIMATORS``.
        tokens: completion mask and KL for the token-level estimators (``reinforce_plus_plus*``).
    """
    _check(rewards, group_size, scale_rewards, adv_estimator)
    dtype = rewards.dtype
    # float64: in float32 the mean of G equal rewards can miss by an ulp, and dividing by (std + 1e-4) turns
    # that into a same-sign advantage for the whole group (0.0024 for five rewards of 3.8).
    rewards = rewards.double()
    advantages = ADV_ESTIMATORS[adv_estimator](rewards, group_size, scale_rewards, tokens)
    return _result(advantages, rewards, dtype)


def group_advantages(rewards: Tensor, group_size: int, scale_rewards: str = "group") -> Tensor:
    """GRPO's advantages; shorthand for ``compute_advantages(...).advantages``.

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, scale_rewards="none")
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    """
    return compute_advantages(rewards, group_size, scale_rewards).advantages


def multi_objective_advantages(
    per_function: Tensor,
    weights: Tensor,
    group_size: int,
    multi_objective_aggregation: str = "sum_then_normalize",
    scale_rewards: str = "group",
    adv_estimator: str = "grpo",
    tokens: TokenRewards | None = None,
) -> Advantages:
    """Advantages from every reward function's scores, combined as ``multi_objective_aggregation`` says.

    Args:
        per_function: [N, F] rewards, NaN where a function returned None.
        weights: [F] weight of each function.
        multi_objective_aggregation: "sum_then_normalize" (the weighted sum goes to ``compute_advantages``) or
            "normalize_then_sum" (GDPO; always group- then batch-normalised, so ``grpo`` only and no
            ``scale_rewards``).
    """
    if multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise ValueError(
            f"multi_objective_aggregation must be one of {list(MULTI_OBJECTIVE_AGGREGATIONS)}, "
            f"got {multi_objective_aggregation!r}"
        )
    if multi_objective_aggregation == "sum_then_normalize":
        return compute_advantages(
            weighted_total(per_function, weights), group_size, scale_rewards, adv_estimator, tokens
        )
    if adv_estimator != "grpo":
        raise ValueError(
            f"multi_objective_aggregation 'normalize_then_sum' (GDPO) works with adv_estimator 'grpo' only, "
            f"got {adv_estimator!r}"
        )
    return gdpo_advantages(per_function, weights, group_size)


def gdpo_advantages(per_function: Tensor, weights: Tensor, group_size: int) -> Advantages:
    """GDPO: each function normalised within its group, weighted sum, then ``(s - mean) / (std + 1e-4)`` over
    the batch; TRL 1.16's ``normalize_then_sum``. (TRL's ``frac_reward_zero_std`` here tests the batch std
    instead: 0 or 1; ours groups the weighted reward sum, as for every aggregation)."""
    _check(per_function[:, 0], group_size, "group", "grpo")
    dtype = per_function.dtype
    scores = per_function.double()  # [N, F]
    grouped = scores.view(-1, group_size, scores.shape[1])  # [N/G, G, F]
    normalised = (grouped - grouped.nanmean(dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + STD_EPS)
    summed = weighted_total(normalised.view_as(scores), weights.double())  # [N], NaN where all were None
    advantages = (summed - summed.nanmean()) / (nanstd(summed) + STD_EPS)  # [N]
    return _result(advantages, weighted_total(scores, weights.double()), dtype)


def _check(rewards: Tensor, group_size: int, scale_rewards: str, adv_estimator: str) -> None:
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {list(SCALE_REWARDS)}, got {scale_rewards!r}")
    if adv_estimator not in ADV_ESTIMATORS:
        raise ValueError(f"adv_estimator must be one of {sorted(ADV_ESTIMATORS)}, got {adv_estimator!r}")
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}: expected [N] with N divisible into whole groups of "
            f"num_generations={group_size}"
        )


def _result(advantages: Tensor, rewards: Tensor, dtype: torch.dtype) -> Advantages:
    """NaN rewards (every function said None) get advantage 0."""
    if advantages.ndim == 1:
        advantages = torch.where(rewards.isnan(), 0.0, advantages)
    return Advantages(advantages=torch.nan_to_num(advantages, nan=0.0).to(dtype))
