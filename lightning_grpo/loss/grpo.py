"""Per-token log-probs + advantages -> the GRPO-family loss. Pure functions: no model, no trainer, no logging.

Papers: GRPO arXiv:2402.03300, DAPO arXiv:2503.14476, Dr. GRPO arXiv:2503.20783, GSPO arXiv:2507.18071,
CISPO (MiniMax-M1) arXiv:2506.13585, SAPO arXiv:2511.20347, LUSPO arXiv:2602.05261, VESPO arXiv:2602.10693,
off-policy sequence masking and the bias-corrected KL (DeepSeek-V3.2) arXiv:2512.02556, high-entropy tokens
("Beyond the 80/20 rule") arXiv:2506.01939, adaptive entropy control (Skywork-OR1) arXiv:2505.22312.
For a single micro-batch on one process, value and gradient equal TRL 1.16's ``GRPOTrainer._compute_loss``.

A loss type is one row of ``LOSS_TYPES``: a policy term (clipped surrogate, CISPO, SAPO or VESPO) and a reduction.

Where we deviate from TRL, on purpose:
- ``bnpo`` divides by the active tokens of the whole local generation batch, not of each micro-batch, so
  splitting a step into micro-batches never changes the update (TRL's bnpo does change with accumulation).
- ``grpo``, ``sapo``, ``luspo`` and ``dr_grpo`` divide by the local batch's completion count rather than by
  micro-batch count times accumulation steps; equal when micro-batches are equal-sized, exact when they are not.
  The entropy bonus divides by the local batch's (trained) token count (TRL: each micro-batch's mean divided by
  the accumulation steps); the same for one micro-batch, additive for several.
- ``cispo`` caps the ratio at ``epsilon_high`` itself, as TRL does (not ``1 + epsilon_high``), and so refuses
  an ``epsilon_high`` below 1 (TRL's default ``epsilon_high = epsilon = 0.2`` would scale every on-policy token
  by 0.2); MiniMax-M1 and ScaleRL use 5.0.
- Metrics are token means: ``vespo/phi_seq_mean`` and the sequence-level clip ratios weight each completion by
  its token count (TRL: one value per completion).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_grpo.loss.config import LossConfig
from lightning_grpo.loss.entropy import high_entropy_mask
from lightning_grpo.loss.objectives import PolicyInputs
from lightning_grpo.loss.reduce import LOSS_TYPES, LossNormalizer, at_least_one
from lightning_grpo.types import Collectives, UpdateStats

# metric -> (the token flag it is taken over, its reduction over completions, how micro-batches and ranks
# combine it: NaN-ignoring, as TRL's nanmin / nanmax)
EXTREMES = {
    "clip_ratio/low_min": ("clip_ratio/low_mean", torch.amin, torch.fmin),
    "clip_ratio/high_max": ("clip_ratio/high_mean", torch.amax, torch.fmax),
}


@dataclass
class LossOutput:
    loss: Tensor  # scalar, carries the gradient
    token_sums: dict[str, Tensor] = field(default_factory=dict)  # metric -> sum over masked tokens (detached)
    num_tokens: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # masked tokens summed over
    trained_entropy: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # entropy summed over trained tokens
    trained_tokens: Tensor = field(default_factory=lambda: torch.tensor(0.0))  # tokens the policy term trains on
    extremes: dict[str, Tensor] = field(default_factory=dict)  # ``EXTREMES`` name -> min or max over sequences

    def __add__(self, other: LossOutput) -> LossOutput:
        """Combine micro-batches: losses and token sums add, extremes take the min or max (NaN: none)."""
        sums = {k: self.token_sums.get(k, 0.0) + v for k, v in other.token_sums.items()}
        extremes = {
            k: EXTREMES[k][2](self.extremes[k], v) if k in self.extremes else v for k, v in other.extremes.items()
        }
        return LossOutput(
            self.loss + other.loss,
            sums,
            self.num_tokens + other.num_tokens,
            self.trained_entropy + other.trained_entropy,
            self.trained_tokens + other.trained_tokens,
            extremes,
        )

    def over_ranks(self, ranks: Collectives) -> LossOutput:
        """Loss metrics of the global batch, as TRL gathers them: token sums and counts added over ranks, and
        the loss averaged (each rank's loss is scaled so that DDP's gradient average is the global gradient). A
        collective; itself with one process."""
        if ranks.world_size == 1:
            return self
        names = sorted(self.token_sums)
        counts = [self.trained_entropy, self.trained_tokens, self.num_tokens, self.loss]
        parts = [self.token_sums[k] for k in names] + counts  # a count never added to stays on the host
        local = torch.stack([torch.as_tensor(p, device=self.loss.device).float() for p in parts])
        total = ranks.sum(local)  # [M + 4] one all-reduce
        extremes, combined = sorted(self.extremes), {}
        if extremes:
            every = ranks.gather_rows(torch.stack([self.extremes[k].float() for k in extremes]).unsqueeze(0))  # [W, E]
            combined = {k: functools.reduce(EXTREMES[k][2], every[:, i]) for i, k in enumerate(extremes)}
        return LossOutput(
            total[-1] / ranks.world_size, dict(zip(names, total[:-4])), total[-2], total[-4], total[-3], combined
        )

    def metrics(self) -> dict[str, Tensor]:
        """Token-mean of each metric, with TRL's names (``kl``, ``clip_ratio/low_mean`` ...), and
        ``entropy/trained_mean`` over the tokens trained on (``top_entropy_quantile``) when entropies were given
        (NaN when no token was trained on): 0-d tensors on the loss's device, read by ``types.to_host``."""
        n = self.num_tokens.clamp(min=1.0)
        out = {name: total / n for name, total in self.token_sums.items()}
        out |= dict(self.extremes)
        if "entropy" in self.token_sums:
            trained = self.trained_tokens
            out["entropy/trained_mean"] = torch.where(trained > 0, self.trained_entropy / trained, torch.nan)
        return out

    def stats(self, grad_norm: float | Tensor = float("nan"), trained_entropy: bool = False) -> UpdateStats:
        """The typed record of the update: the loss and its token means (entropy, clip ratios, KL when
        computed), the completions' extreme clip shares, the pre-clip gradient norm, and with
        ``trained_entropy`` the entropy of the tokens trained on (``top_entropy_quantile`` < 1). Its numbers are
        0-d tensors until ``types.to_host`` reads the step's record."""
        means = self.metrics()
        known = {"entropy", "kl", "entropy/trained_mean", *(k for k in means if k.startswith("clip_ratio/"))}
        return UpdateStats(
            loss=self.loss.detach(),
            entropy=means.get("entropy", 0.0),
            clip_low=means.get("clip_ratio/low_mean"),
            clip_high=means.get("clip_ratio/high_mean"),
            clip_region=means.get("clip_ratio/region_mean"),
            clip_low_min=means.get("clip_ratio/low_min", float("nan")),
            clip_high_max=means.get("clip_ratio/high_max", float("nan")),
            grad_norm=grad_norm,
            loss_tokens=self.num_tokens,
            kl=means.get("kl"),
            trained_entropy=means.get("entropy/trained_mean") if trained_entropy else None,
            term={k: v for k, v in means.items() if k not in known},
        )


def off_policy_mask(
    advantages: Tensor, logps: Tensor, sampling_logps: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """[n, 1] DeepSeek-V3.2's off-policy sequence mask: 0 drops a completion whose advantage is negative and whose
    mean ``sampling_logp - logp`` over its tokens exceeds ``threshold``; NaN sampler log-probs count as 0.
    ([n, T] for per-token advantages.)"""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)  # [n, T]
    mean_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # [n, 1]
    adv = advantages if advantages.ndim == 2 else advantages.unsqueeze(-1)  # [n, 1] or [n, T]
    return ((adv >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def grpo_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig | None = None,
    *,
    ref_logps: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
    max_completion_length: int | None = None,
    sampling_weights: Tensor | None = None,
    sampling_logps: Tensor | None = None,
    entropies: Tensor | None = None,
    entropy_threshold: Tensor | None = None,
    entropy_coef: float | None = None,
    **options,
) -> LossOutput:
    """The loss of ``config.loss_type`` with optional k3 KL penalty, masks and entropy bonus.

    Args:
        logps: [n, T] per-token log-probs under the current policy (with grad).
        old_logps: [n, T] log-probs under the policy that sampled; ``None`` means ``logps.detach()``
            (one optimisation pass per generation batch: ratio 1, loss value ~0, gradient not 0).
        advantages: [n] one advantage per completion, or [n, T] per token (``reinforce_plus_plus``).
        mask: [n, T] 1 on tokens that count in the loss.
        config: every loss option (``LossConfig``); ``None`` means TRL's defaults.
        ref_logps: [n, T] reference-model log-probs; required when ``beta > 0``.
        normalizer: counts of the whole generation batch; ``None`` treats ``mask`` as the whole batch.
        max_completion_length: the divisor of dr_grpo when ``normalizer`` is ``None``; defaults to T.
        sampling_weights: [n, T] or [n, 1] ``sampling_correction`` weights on the policy term (not the KL).
        sampling_logps: [n, T] the sampler's log-probs for ``off_policy_mask_threshold``; default ``old_logps``.
        entropies: [n, T] per-token entropies; needed for ``top_entropy_quantile < 1`` and the entropy bonus
            (give them with grad for the bonus to have one).
        entropy_threshold: scalar from ``entropy.entropy_threshold`` over the whole batch (all ranks);
            ``None`` computes it from this micro-batch, as TRL does.
        entropy_coef: the entropy bonus weight applied now (``EntropyController.coef_to_apply()``);
            ``None`` means ``config.entropy_coef``.
        **options: ``LossConfig`` fields overriding ``config`` (``loss_type="grpo"``, ``beta=0.04`` ...).
    """
    c = _with_options(config or LossConfig(), options)
    kind = LOSS_TYPES[c.loss_type]
    if c.beta > 0 and ref_logps is None:
        raise ValueError(f"beta={c.beta} > 0 needs ref_logps (the reference model's log-probs)")
    mask = mask.to(logps.dtype)
    norm = normalizer or LossNormalizer.from_mask(mask, max_completion_length)
    old_logps = logps.detach() if old_logps is None else old_logps

    log_ratio = logps - old_logps  # [n, T]
    level_log_ratio = log_ratio
    if c.importance_sampling_level == "sequence":
        level_log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [n, 1]
    ratio = torch.exp(level_log_ratio)  # [n, T] or [n, 1]
    adv = advantages if advantages.ndim == 2 else advantages.unsqueeze(-1)  # [n, 1], or [n, T] (REINFORCE++)
    x = PolicyInputs(logps, log_ratio, ratio, adv, mask, sampling_weights)
    per_token_loss, flags = kind.term(x, c)  # [n, T] or [n, 1]

    sampled = old_logps if sampling_logps is None else sampling_logps
    token_mask, trained = _token_masks(c, adv, logps, sampled, mask, entropies, entropy_threshold)
    per_token_loss = per_token_loss * token_mask
    if sampling_weights is not None and not kind.weights_in_term:
        per_token_loss = per_token_loss * sampling_weights

    per_token_loss, sums = _with_kl(per_token_loss, logps, ref_logps, ratio, mask, c)
    loss = kind.reduce(per_token_loss.expand_as(mask) * mask, mask, norm)

    coef = c.entropy_coef if entropy_coef is None else entropy_coef
    if coef != 0.0 or c.use_adaptive_entropy:
        bonus_tokens = norm.num_tokens if c.top_entropy_quantile >= 1.0 else norm.num_trained_tokens
        loss = loss - coef * entropy_bonus(_need(entropies, "entropy_coef"), trained, norm, bonus_tokens)
    for name, flag in flags.items():
        sums[name] = (flag.to(mask.dtype).expand_as(mask) * mask).sum().detach()
    extremes = sequence_extremes(flags, mask)
    out = LossOutput(loss, sums, mask.sum().detach(), trained_tokens=trained.sum().detach(), extremes=extremes)
    if entropies is not None:
        sums["entropy"] = (entropies.detach() * mask).sum()  # over all loss tokens, as TRL logs it
        out.trained_entropy = (entropies.detach() * trained).sum()  # what the adaptive controller measures
    return out


def _with_kl(
    per_token_loss: Tensor, logps: Tensor, ref_logps: Tensor | None, ratio: Tensor, mask: Tensor, c: LossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy term plus ``beta`` times the k3 KL to the reference ([n, T]) and the KL's token sum (``kl``);
    unchanged, with no sums, when ``beta`` is 0."""
    if c.beta == 0:
        return per_token_loss, {}
    kl = k3_kl(ref_logps, logps)  # [n, T]
    sums = {"kl": (kl.detach() * mask).sum()}
    if c.use_bias_correction_kl:
        kl = kl * ratio  # unbiased reverse-KL gradient off-policy; the ratio's gradient counts on-policy too
    return per_token_loss + c.beta * kl, sums


def sequence_extremes(flags: dict[str, Tensor], mask: Tensor) -> dict[str, Tensor]:
    """TRL's ``clip_ratio/low_min`` and ``clip_ratio/high_max``: the lowest share of low-clipped tokens and the
    highest share of high-clipped tokens of one completion ([n, T] or [n, 1] flags over the [n, T] ``mask``);
    NaN when no completion has a loss token.

    >>> low = torch.tensor([[True, False], [False, False]])
    >>> sequence_extremes({"clip_ratio/low_mean": low, "clip_ratio/high_mean": low}, torch.ones(2, 2))
    {'clip_ratio/low_min': tensor(0.), 'clip_ratio/high_max': tensor(0.5000)}
    """
    out = {}
    counts = mask.sum(-1)  # [n]
    empty = counts == 0  # [n] completions without a loss token: left out (masked, not selected: no host read)
    for name, (source, reduce, _) in EXTREMES.items():
        if source in flags:
            shares = (flags[source].to(mask.dtype).expand_as(mask) * mask).sum(-1) / counts.clamp(min=1.0)  # [n]
            neutral = shares.new_tensor(float("inf") if reduce is torch.amin else float("-inf"))
            value = reduce(shares.detach().masked_fill(empty, neutral)) if len(shares) else neutral
            out[name] = torch.where(empty.all(), torch.nan, value)
    return out


def k3_kl(ref_logps: Tensor, logps: Tensor) -> Tensor:
    """[n, T] the k3 estimator of KL(policy || reference) per token: ``exp(ref - logp) - (ref - logp) - 1 >= 0``."""
    diff = ref_logps - logps
    return torch.exp(diff) - diff - 1


def _token_masks(
    c: LossConfig,
    adv: Tensor,
    logps: Tensor,
    sampled: Tensor,
    mask: Tensor,
    entropies: Tensor | None,
    entropy_threshold: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """([n, T] tokens the policy term trains on, [n, T] tokens the entropy bonus and its metric cover): the loss
    mask less off-policy sequences (``off_policy_mask_threshold``) and low-entropy tokens (``top_entropy_quantile``)."""
    token_mask = mask
    if c.off_policy_mask_threshold is not None:
        token_mask = token_mask * off_policy_mask(adv, logps, sampled, mask, c.off_policy_mask_threshold)
    trained = mask
    if c.top_entropy_quantile < 1.0:
        ent = _need(entropies, "top_entropy_quantile")
        trained = mask * high_entropy_mask(ent, mask, c.top_entropy_quantile, entropy_threshold)
        token_mask = token_mask * trained
    return token_mask, trained


def entropy_bonus(
    entropies: Tensor, trained: Tensor, norm: LossNormalizer, batch_tokens: float | Tensor | None
) -> Tensor:
    """Mean entropy over the trained tokens, the same for every loss type (TRL: ``L - entropy_coef * H``).

    With the batch's trained-token count, a micro-batch contributes its sum over that count, so micro-batches add
    up exactly; without it (``top_entropy_quantile < 1`` and no ``num_trained_tokens``), its own mean weighted by
    its share of the batch's completions (TRL: the micro-batch mean over the accumulation steps).
    """
    total = (entropies * trained).sum()
    if batch_tokens is not None:
        return total / at_least_one(batch_tokens)
    return total / trained.sum().clamp(min=1.0) * trained.shape[0] / norm.num_sequences


def _with_options(config: LossConfig, options: dict) -> LossConfig:
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(LossConfig)})
    if unknown:
        raise TypeError(f"grpo_loss got unknown options {unknown}: LossConfig's fields are the options")
    return dataclasses.replace(config, **options) if options else config


def _need(tensor: Tensor | None, option: str) -> Tensor:
    if tensor is None:
        raise ValueError(f"{option} needs per-token entropies: pass entropies=[n, T]")
    return tensor
