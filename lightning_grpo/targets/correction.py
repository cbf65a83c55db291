"""Sampler and trainer log-probs -> importance weights that correct for their mismatch, and the metrics that
measure it. The one owner of ``update.sampling_correction``: its choices, their default bounds, the rule that
resolves ``auto``, the checks of its bounds, and the resolved ``SamplerCorrection`` that ``build_targets`` asks for
the weights and the anchor. Pure tensor math: knows nothing of engines or models (an engine tells only how many
updates its samples may lag: ``resolve_auto``).

When another engine (vLLM) samples the completions, its log-probs differ from the trainer's (kernels, precision,
weights one sync behind), so the policy term of the loss is re-weighted by the probability ratio of the trained
policy to the sampler, ``rho = exp(old_logps - sampling_logps)``. A correction is one row of ``CORRECTIONS``: the
level the ratio is taken at, what happens outside the bounds, and its default bounds; ``icepop`` and ``decoupled``
are presets of ``token_mask`` (the same math, other default bounds). ``bypass`` is the one correction that is not a
weight: the sampler's log-probs become the loss's old log-probs (``BYPASS``).

The three policies (AReaL's decoupled PPO, arXiv:2505.24298): the *behaviour* policy is the sampler
(``Rollout.sampling_logps``, possibly several weight versions behind in async training); the *proximal* policy is
the trainer's recomputation with the weights at the start of the generation batch (``Targets.old_logps``,
``build_targets`` computes it whenever a correction is on); the *current* policy is the one being trained
(``logps`` in the loss). Every row weights the clipped surrogate of current/proximal by a function of
proximal/behaviour, so every row is a decoupled loss; the ``decoupled`` row is AReaL's own weight
(``behav_imp_weight_cap``: token ratios above the cap are dropped, no lower bound); its weights are
``token_mask``'s with the same cap (tested), its default cap AReaL's examples' 5. With a stale sampler (async
training) nothing changes in the math: ``old_logps`` must then be recomputed with the trainer's weights when the
batch is trained, which is what ``build_targets`` does, while ``sampling_logps`` stay the stale sampler's.

Where we deviate from verl (``rollout_corr_helper.py``): a rejected token or sequence gets weight 0 but stays in
the loss normaliser (TRL's ``*_mask`` semantics), whereas verl's rejection sampling removes it from the
``response_mask`` and so from a token-mean's denominator. The normaliser is fixed before the correction, so
micro-batching never changes the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lightning_grpo.types import MismatchStats

SAFETY_BOUND = 20.0  # |log-ratio| is clamped here before exp (verl's bound): e^20 ~ 4.9e8


def token_level(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[n, T] one ratio per token."""
    return log_ratio


def sequence_sum(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[n, 1] the completion's probability ratio: the sum of its token log-ratios (TRL's ``sequence_*``)."""
    return (log_ratio * mask).sum(-1, keepdim=True)


def sequence_mean(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[n, 1] the geometric mean of the completion's token ratios: their mean log-ratio (verl's ``geometric``)."""
    return (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


def truncate(rho: Tensor, low: float, high: float) -> Tensor:
    """The ratio clamped into [low, high] (truncated importance sampling)."""
    return rho.clamp(low, high)


def mask_keep_ratio(rho: Tensor, low: float, high: float) -> Tensor:
    """The ratio inside [low, high], 0 outside (TRL's ``*_mask``, IcePop's M(k; alpha, beta))."""
    return rho.masked_fill((rho < low) | (rho > high), 0.0)


def mask_only(rho: Tensor, low: float, high: float) -> Tensor:
    """1 inside [low, high], 0 outside: rejection without re-weighting (verl's rejection sampling)."""
    return ((rho >= low) & (rho <= high)).to(rho.dtype)


@dataclass(frozen=True)
class Correction:
    """One way to correct for the sampler: where the ratio is taken, what the bounds do, the default bounds."""

    level: Callable[[Tensor, Tensor], Tensor]  # (log_ratio [n, T], mask [n, T]) -> log-ratio [n, T] or [n, 1]
    bound: Callable[[Tensor, float, float], Tensor]  # (rho, low, high) -> weights
    low: float  # default lower bound; 0 means none (ratios are positive)
    high: float  # default upper bound; inf means none
    source: str


TOKEN_MASK = Correction(token_level, mask_keep_ratio, 0.0, 3.0, "TRL vllm_importance_sampling_mode")
CORRECTIONS = {
    "token_truncate": Correction(token_level, truncate, 0.0, 3.0, "TRL vllm_importance_sampling_mode (TIS)"),
    "token_mask": TOKEN_MASK,
    "sequence_truncate": Correction(sequence_sum, truncate, 0.0, 3.0, "TRL vllm_importance_sampling_mode"),
    "sequence_mask": Correction(sequence_sum, mask_keep_ratio, 0.0, 3.0, "TRL's default (MIS)"),
    "icepop": replace(TOKEN_MASK, low=0.5, high=5.0, source="IcePop (Ring-1T arXiv:2510.18855), alpha, beta"),
    "geometric_mask": Correction(sequence_mean, mask_only, 1 / 1.001, 1.001, "verl rollout_rs='geometric' preset"),
    "decoupled": replace(TOKEN_MASK, high=5.0, source="AReaL behav_imp_weight_cap"),
}
# The sampler as PPO's anchor: the loss's ratio and clip are taken against the sampler's log-probs and no weight
# applies (verl's ``rollout_correction.bypass_mode``, Tinker's PPO loss). The clip then bounds how far an update
# moves from the weights that sampled, which a stale sampler (async training) needs; the rows above anchor at the
# weights that start the update instead and only re-weight.
BYPASS = "bypass"
AUTO = "auto"  # chosen for the engine: ``resolve_auto``
SAMPLING_CORRECTIONS = (*CORRECTIONS, BYPASS)
CHOICES = (*SAMPLING_CORRECTIONS, AUTO, None)  # what ``update.sampling_correction`` accepts; None: off


def correction_bounds(mode: str, low: float | None, high: float | None) -> tuple[float, float]:
    """The bounds a correction uses: the settings where given, else the row's defaults.

    >>> correction_bounds("icepop", None, None), correction_bounds("token_mask", 0.1, None)
    ((0.5, 5.0), (0.1, 3.0))
    """
    row = CORRECTIONS[mode]
    return (row.low if low is None else low, row.high if high is None else high)


def sampling_correction(
    old_logps: Tensor,
    sampling_logps: Tensor,
    mask: Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> Tensor:
    """Importance weights on the policy term for tokens another engine sampled (detached: no gradient).

    Args:
        old_logps: [n, T] the trainer's log-probs of the sampled tokens (the proximal policy).
        sampling_logps: [n, T] the sampler's (NaN where it gave none: ratio 1 there, as TRL does).
        mask: [n, T] loss tokens.
        mode: a row of ``CORRECTIONS``.
        clip_min, clip_max: the bounds; ``None`` takes the row's default.

    Returns:
        [n, T] for token rows, [n, 1] for sequence rows.

    >>> import torch
    >>> old, sampled, mask = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.5, -2.0]]), torch.ones(1, 2)
    >>> sampling_correction(old, sampled, mask, "token_truncate", clip_max=2.0)  # e^0.5 = 1.65, e^1 capped at 2
    tensor([[1.6487, 2.0000]])
    >>> sampling_correction(old, sampled, mask, "sequence_mask")  # e^1.5 = 4.48 > 3: masked
    tensor([[0.]])
    >>> sampling_correction(old, sampled, mask, "icepop", clip_max=2.0)  # e^1 = 2.72 outside [0.5, 2]
    tensor([[1.6487, 0.0000]])
    >>> sampling_correction(old, sampled, mask, "geometric_mask", 0.5, 2.0)  # e^0.75 = 2.12 > 2: rejected
    tensor([[0.]])
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"sampling_correction must be one of {list(CORRECTIONS)}, got {mode!r}")
    row = CORRECTIONS[mode]
    low, high = correction_bounds(mode, clip_min, clip_max)
    log_ratio = ((old_logps - sampling_logps) * mask).nan_to_num(0.0).detach()  # [n, T]
    rho = row.level(log_ratio, mask).exp()  # [n, T] or [n, 1]
    return row.bound(rho, low, high)


def resolve_auto(name: str | None, low: float | None, high: float | None, max_staleness: int) -> str | None:
    """The rule for ``auto``: ``bypass`` for an engine whose samples are up to ``max_staleness`` > 0 updates behind
    (``RolloutEngine.max_staleness``), TRL's ``sequence_mask`` otherwise; a named correction (or None) is kept.
    Raises ``ValueError`` when bounds are set and ``auto`` would be ``bypass``, which has nothing to bound.

    >>> resolve_auto(AUTO, None, None, 0), resolve_auto(AUTO, None, None, 2), resolve_auto("icepop", None, None, 2)
    ('sequence_mask', 'bypass', 'icepop')
    """
    if name != AUTO:
        return name
    if max_staleness > 0 and (low, high) != (None, None):
        raise ValueError(
            f"update.sampling_correction='auto' is 'bypass' for an engine sampling up to {max_staleness} "
            f"update(s) ahead, which applies no weight for update.sampling_correction_min/max (got {low!r}/{high!r}) "
            f"to bound: name the correction they bound (one of {list(CORRECTIONS)}), or leave them unset"
        )
    return BYPASS if max_staleness > 0 else "sequence_mask"


def resolved_bounds(name: str | None, low: float | None, high: float | None) -> tuple[float, float]:
    """[low, high] of correction ``name``: the settings, or its defaults where ``None``; unbounded for ``bypass``
    and off (None). ``auto`` has none until ``resolve_auto`` names the correction."""
    if name == AUTO:
        raise ValueError("update.sampling_correction='auto' has no bounds until for_engine resolves it")
    if name in (BYPASS, None):
        return 0.0, math.inf
    return correction_bounds(name, low, high)


def correction_problems(name: str | None, low: float | None, high: float | None) -> list[tuple[bool, str]]:
    """The checks of ``update.sampling_correction`` and its bounds, as ``(ok, message)`` pairs."""
    checks = [
        (name in CHOICES, f"update.sampling_correction must be one of {list(CHOICES)}, got {name!r}"),
        (low is None or low >= 0, f"update.sampling_correction_min must be >= 0 (None: the default), got {low!r}"),
        (high is None or high > 0, f"update.sampling_correction_max must be > 0 (None: the default), got {high!r}"),
    ]
    if name in (BYPASS, None):
        checks.append(
            (
                low is None and high is None,
                f"update.sampling_correction_min/max bound a weight, and update.sampling_correction={name!r} applies "
                "none: leave them unset",
            )
        )
    elif name in CORRECTIONS:
        lo, hi = correction_bounds(name, low, high)
        checks.append(
            (
                lo < hi,
                f"update.sampling_correction_min must be below update.sampling_correction_max for {name!r}, got "
                f"[{lo!r}, {hi!r}]",
            )
        )
    return checks


@dataclass(frozen=True)
class SamplerCorrection:
    """``update.sampling_correction`` resolved for the engine (``UpdateConfig.correction``): what ``build_targets``
    asks when another engine sampled the rollout.

    >>> c = SamplerCorrection("icepop", 0.5, 5.0)
    >>> c.anchored, c.weights(torch.zeros(1, 2), torch.tensor([[0.0, -2.0]]), torch.ones(1, 2))
    (False, tensor([[1., 0.]]))
    >>> SamplerCorrection(BYPASS).anchored, SamplerCorrection(BYPASS).weights(None, None, None) is None
    (True, True)
    """

    name: str | None  # a row of CORRECTIONS, BYPASS, or None (off: the mismatch is still measured)
    low: float = 0.0
    high: float = math.inf

    @property
    def anchored(self) -> bool:
        """Whether the loss's ratio and clip are taken against the sampler's log-probs (``bypass``), not weighted."""
        return self.name == BYPASS

    def weights(self, old_logps: Tensor, sampling_logps: Tensor, mask: Tensor) -> Tensor | None:
        """[n, T] or [n, 1] the importance weights on the policy term (``sampling_correction``); None without any."""
        if self.name not in CORRECTIONS:
            return None
        return sampling_correction(old_logps, sampling_logps, mask, self.name, self.low, self.high)


def correction_metrics(weights: Tensor | None, mask: Tensor) -> dict[str, float]:
    """min / mean / max of the correction weights over the loss tokens, with TRL's names; none without them.

    >>> import torch
    >>> correction_metrics(torch.tensor([[0.5], [2.0]]), torch.ones(2, 3))
    {'sampling/importance_sampling_ratio/min': 0.5, 'sampling/importance_sampling_ratio/mean': 1.25, \
'sampling/importance_sampling_ratio/max': 2.0}
    """
    if weights is None:
        return {}
    active = weights.expand_as(mask)[mask.bool()]  # [tokens]
    if not active.numel():
        return {}
    values = (active.min(), active.mean(), active.max())
    return {f"sampling/importance_sampling_ratio/{k}": v.item() for k, v in zip(("min", "mean", "max"), values)}


def mismatch_stats(old_logps: Tensor, sampling_logps: Tensor, mask: Tensor) -> MismatchStats | None:
    """How far the sampler's log-probs are from the trainer's over the loss tokens (those it scored).

    With ``d = old_logps - sampling_logps`` per token and ``rho = exp(d)``:
    ``token_mult_prob_error = mean(exp(|d|))`` (NeMo-RL's ``ClippedPGLossFn``: 1 when equal),
    ``kl = mean(rho - d - 1)``, the k3 estimator of KL(sampler || trainer) on tokens the sampler drew (verl's
    ``k3_kl``), ``logp_diff_mean/max = mean/max |d|`` (TRL's ``sampling_logp_difference``), the 5th/50th/95th
    percentiles of rho, and the normalised effective sample size ``ess = mean(w)^2 / mean(w^2)`` in (0, 1] of the
    token ratios and of the completions' ratios (``exp`` of the sum of their ``d``). ``None`` without any token.

    Args:
        old_logps, sampling_logps, mask: [n, T]; NaN sampler log-probs leave their token out.

    >>> d = torch.log(torch.tensor([[1.0, 2.0, 0.5, 1.0]]))
    >>> s = mismatch_stats(d, torch.zeros(1, 4), torch.ones(1, 4))
    >>> round(s.token_mult_prob_error, 4), round(s.kl, 4), round(s.ess_token, 4)
    (1.5, 0.125, 0.81)

    (exp|d| = 1, 2, 2, 1; k3 = 0, 2 - ln 2 - 1, 0.5 + ln 2 - 1, 0 sum to 0.5; ESS = 1.125^2 / 1.5625.)
    """
    valid = mask.bool() & sampling_logps.isfinite() & old_logps.isfinite()  # [n, T]
    if not valid.any():
        return None
    d = torch.where(valid, old_logps - sampling_logps, 0.0).detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [n, T]
    tokens = d[valid]  # [k]
    rho = tokens.exp()
    seq_rho = d.sum(-1)[valid.any(-1)].clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()  # [completions]
    p5, p50, p95 = percentiles(rho, (0.05, 0.5, 0.95))
    return MismatchStats(
        token_mult_prob_error=tokens.abs().exp().mean().item(),
        kl=(rho - tokens - 1).mean().item(),
        logp_diff_mean=tokens.abs().mean().item(),
        logp_diff_max=tokens.abs().max().item(),
        ratio_p5=p5,
        ratio_p50=p50,
        ratio_p95=p95,
        ess_token=normalised_ess(rho),
        ess_sequence=normalised_ess(seq_rho),
    )


def percentiles(x: Tensor, qs: tuple[float, ...]) -> list[float]:
    """``torch.quantile``'s linear interpolation, from one sort and without its 16M-element limit (a batch of
    512 completions of 32k tokens is past it).

    >>> percentiles(torch.tensor([4.0, 1.0, 3.0, 2.0]), (0.0, 0.5, 0.95))
    [1.0, 2.5, 3.8499999046325684]
    """
    s = x.flatten().sort().values  # [k]
    out = []
    for q in qs:
        pos = q * (s.numel() - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append((s[lo] + (s[hi] - s[lo]) * (pos - lo)).item())
    return out


def normalised_ess(w: Tensor) -> float:
    """Kish's effective sample size over the sample count: ``(sum w)^2 / (n sum w^2)`` in (0, 1]; 1 when all
    weights are equal, 1/n when one weight carries everything (verl's ``1 / mean((w / mean w)^2)``).

    >>> normalised_ess(torch.tensor([1.0, 1.0])), normalised_ess(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    (1.0, 0.25)
    """
    w = w.double()
    return math.nan if not w.numel() else (w.mean() ** 2 / (w**2).mean()).item()
