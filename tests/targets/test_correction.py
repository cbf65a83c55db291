"""targets/correction.py: every sampler correction equals its reference (TRL 1.16, verl, AReaL) on the same tensors,
in value and in the loss's gradient, and the mismatch metrics equal NeMo-RL's and verl's definitions.

TRL's correction is inline in ``GRPOTrainer._generate_and_score_completions`` and verl / AReaL are not installed
here, so each reference is reproduced below from its source, cited, with only the tensor math kept.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.loss import LossConfig, grpo_loss
from lightning_grpo.targets.config import UpdateConfig
from lightning_grpo.targets.correction import (
    CORRECTIONS,
    correction_bounds,
    mismatch_stats,
    normalised_ess,
    percentiles,
    sampling_correction,
)

N, T = 8, 6


def make(seed=0, spread=0.3):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(N, T, generator=gen) * 0.5 - 1.5  # trainer (proximal) log-probs
    sampling = old + torch.randn(N, T, generator=gen) * spread  # the sampler's
    mask = (torch.rand(N, T, generator=gen) > 0.25).float()
    mask[:, 0] = 1
    return old, sampling, mask


# ---- references ------------------------------------------------------------------------------------------------


def trl_correction(old, sampling, mask, mode, clip_min, clip_max):
    """TRL 1.16 ``grpo_trainer.py`` lines 2660-2705 (``vllm_importance_sampling_correction``)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def verl_masked_mean(x, mask, axis=None):
    return (x * mask).sum(axis) / mask.sum(axis).clamp(min=1e-8) if axis is not None else (x * mask).sum() / mask.sum()


def verl_rejection_mask(log_ratio, response_mask, rollout_rs, upper, lower=None):
    """verl ``trainer/ppo/rollout_corr_helper.py`` ``compute_rollout_rejection_mask`` (commit 0b4e2a8), metrics
    left out: the modified response mask."""
    lower = lower if lower is not None else 1.0 / upper
    if rollout_rs == "token":
        weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    elif rollout_rs == "geometric":
        mean = verl_masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        weights = torch.exp(torch.clamp(mean, min=-20.0, max=20.0)).expand_as(log_ratio)
    else:  # "sequence"
        total = (log_ratio * response_mask).sum(-1, keepdim=True)
        weights = torch.exp(torch.clamp(total, min=-20.0, max=20.0)).expand_as(log_ratio)
    keep = ((weights >= lower) & (weights <= upper)).float()
    return response_mask * keep


def verl_is_weights(log_ratio, response_mask, rollout_is, threshold):
    """verl ``compute_rollout_correction_weights`` (same file), no batch normalisation: truncated IS weights."""
    if rollout_is == "token":
        weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:  # "sequence"
        total = (log_ratio * response_mask).sum(-1, keepdim=True)
        weights = torch.exp(torch.clamp(total, min=-20.0, max=20.0)).expand_as(log_ratio)
    return (weights * response_mask).clamp(max=threshold).detach()


def verl_k3_and_ess(old, rollout, response_mask, threshold):
    """verl ``compute_offpolicy_metrics`` (``k3_kl``) and ``compute_is_metrics`` (``rollout_is_eff_sample_size``,
    token level: weights clamped to [1/threshold, threshold] first)."""
    log_ratio = old - rollout
    k3 = verl_masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)
    w = torch.exp(log_ratio).clamp(min=1.0 / threshold, max=threshold)
    normalised = w / (verl_masked_mean(w, response_mask) + 1e-8)
    return k3.item(), 1.0 / verl_masked_mean(normalised.square(), response_mask).item()


def nemo_rl_token_mult_prob_error(prev_logprobs, generation_logprobs, mask):
    """NeMo-RL ``nemo_rl/algorithms/loss_functions.py`` ``ClippedPGLossFn.__call__`` (commit b816b57)."""
    lp_error = torch.abs(generation_logprobs - prev_logprobs)
    return verl_masked_mean(torch.exp(lp_error * mask), mask).item()


def areal_decoupled_loss(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask, cap):
    """AReaL ``ppo_actor_loss_fn`` (``areal/utils/functional``; ``old_logprobs`` is the behaviour policy, the
    sampler): the clipped ratio current/proximal times the behaviour weight proximal/behaviour, dropped above
    ``behav_imp_weight_cap``, averaged over the loss tokens. No dual clip (``c_clip=None``)."""
    loss_mask = loss_mask.bool()
    count = loss_mask.count_nonzero() or 1
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    behav_imp_weight = (proximal_logprobs - old_logprobs).exp()
    behav_mask = (behav_imp_weight <= cap).logical_and(loss_mask)
    behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / count


# ---- each correction equals its reference ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min,clip_max", [(None, 3.0), (0.7, 1.2), (None, 1.05)])
def test_trl_modes_equal_trl(mode, clip_min, clip_max):
    old, sampling, mask = make()
    sampling[2, 3] = math.nan  # a token the sampler did not score: ratio 1, as TRL
    ours = sampling_correction(old, sampling, mask, mode, clip_min, clip_max)
    ref = trl_correction(old, sampling, mask, mode, clip_min, clip_max)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_icepop_is_trls_token_mask_with_both_bounds():
    old, sampling, mask = make(spread=1.2)  # wide: some ratios outside [0.5, 5]
    ours = sampling_correction(old, sampling, mask, "icepop")
    torch.testing.assert_close(ours, trl_correction(old, sampling, mask, "token_mask", 0.5, 5.0), rtol=0, atol=0)
    rho = (old - sampling).exp()
    assert ((rho < 0.5) & mask.bool()).any() and ((rho > 5) & mask.bool()).any()  # both bounds are exercised


def test_icepop_equals_verl_token_is_times_token_rejection():
    """verl composes icepop from a truncated token IS weight and a token rejection mask with the same bounds."""
    old, sampling, mask = make(spread=1.2)
    log_ratio = old - sampling
    verl = verl_is_weights(log_ratio, mask, "token", 5.0) * verl_rejection_mask(log_ratio, mask, "token", 5.0, 0.5)
    torch.testing.assert_close(sampling_correction(old, sampling, mask, "icepop") * mask, verl)


@pytest.mark.parametrize("upper,lower,spread", [(1.001, None, 0.002), (1.05, 0.97, 0.1), (1.2, None, 0.3)])
def test_geometric_mask_equals_verls_geometric_rejection(upper, lower, spread):
    old, sampling, mask = make(spread=spread)
    log_ratio = old - sampling
    expected = verl_rejection_mask(log_ratio, mask, "geometric", upper, lower)
    low = 1.0 / upper if lower is None else lower
    ours = sampling_correction(old, sampling, mask, "geometric_mask", low, upper)  # [N, 1]
    torch.testing.assert_close(ours.expand_as(mask) * mask, expected)
    assert 0 < expected[:, 0].sum() < N  # the comparison keeps some completions and drops some


def test_geometric_default_is_verls_preset():
    assert correction_bounds("geometric_mask", None, None) == pytest.approx((1 / 1.001, 1.001))


def test_sequence_truncate_equals_verls_sequence_is():
    old, sampling, mask = make(spread=0.2)
    expected = verl_is_weights(old - sampling, mask, "sequence", 2.0)
    ours = sampling_correction(old, sampling, mask, "sequence_truncate", None, 2.0)
    torch.testing.assert_close(ours.expand_as(mask) * mask, expected)


@pytest.mark.parametrize("cap", [5.0, 1.3])
def test_decoupled_equals_areal_value_and_gradient(cap):
    """Our loss with ``old_logps`` = proximal and the ``decoupled`` weights is AReaL's decoupled PPO loss."""
    old, sampling, mask = make(spread=1.0)
    gen = torch.Generator().manual_seed(3)
    current = (old + torch.randn(N, T, generator=gen) * 0.15).requires_grad_()  # a later optimiser step
    adv = torch.randn(N, generator=gen)
    weights = sampling_correction(old, sampling, mask, "decoupled", None, cap)
    config = LossConfig(loss_type="dapo", epsilon=0.2, epsilon_high=0.2)
    ours = grpo_loss(current, old, adv, mask, config, sampling_weights=weights).loss
    (grad,) = torch.autograd.grad(ours, current)
    ref = areal_decoupled_loss(current, old, sampling, adv.unsqueeze(-1), 0.2, mask, cap)
    (ref_grad,) = torch.autograd.grad(ref, current)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert grad.abs().sum() > 0 and ((old - sampling).exp() > cap)[mask.bool()].any()  # the cap drops tokens


def test_decoupled_equals_token_mask_with_the_same_cap():
    old, sampling, mask = make(spread=0.6)
    decoupled = sampling_correction(old, sampling, mask, "decoupled", None, 2.0)
    torch.testing.assert_close(decoupled, sampling_correction(old, sampling, mask, "token_mask", None, 2.0))


def test_weights_carry_no_gradient():
    old, sampling, mask = make()
    old.requires_grad_()
    for mode in CORRECTIONS:
        assert not sampling_correction(old, sampling, mask, mode).requires_grad, mode


def test_hand_worked_geometric_mask():
    # log-ratios 0.1 and 0.3 on the loss tokens: mean 0.2, e^0.2 = 1.22 > 1.2 -> dropped; the masked token's 5.0
    # never counts. The second row: mean 0.05, e^0.05 = 1.05 inside [1/1.2, 1.2] -> kept with weight 1.
    old = torch.tensor([[0.1, 0.3, 5.0], [0.05, 0.05, 0.05]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    got = sampling_correction(old, torch.zeros(2, 3), mask, "geometric_mask", 1 / 1.2, 1.2)
    assert got.tolist() == [[0.0], [1.0]]


# ---- the mismatch metrics -------------------------------------------------------------------------------------


def test_token_mult_prob_error_equals_nemo_rl():
    old, sampling, mask = make(spread=0.4)
    stats = mismatch_stats(old, sampling, mask)
    assert stats.token_mult_prob_error == pytest.approx(nemo_rl_token_mult_prob_error(old, sampling, mask), rel=1e-6)


def test_k3_kl_and_ess_equal_verl():
    old, sampling, mask = make(spread=0.1)  # every ratio inside [1/20, 20]: verl's ESS clamp changes nothing
    k3, ess = verl_k3_and_ess(old, sampling, mask, threshold=20.0)
    stats = mismatch_stats(old, sampling, mask)
    assert stats.kl == pytest.approx(k3, rel=1e-5) and stats.ess_token == pytest.approx(ess, rel=1e-5)


def test_hand_worked_mismatch_metrics():
    # One completion of 5 loss tokens with ratios 1, 1, 1, 1, e (the padding token's ratio is ignored).
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    s = mismatch_stats(old, torch.zeros(1, 6), mask)
    e = math.e
    assert s.token_mult_prob_error == pytest.approx((4 + e) / 5)
    assert s.kl == pytest.approx((e - 1 - 1) / 5)  # k3 of the last token: e - 1 - 1; 0 for the others
    assert s.logp_diff_mean == pytest.approx(0.2) and s.logp_diff_max == pytest.approx(1.0)
    assert s.ratio_p50 == pytest.approx(1.0) and s.ratio_p5 == pytest.approx(1.0)
    assert s.ratio_p95 == pytest.approx(1 + 0.8 * (e - 1))  # linear interpolation at 0.95 * 4 = 3.8
    assert s.ess_token == pytest.approx(((4 + e) / 5) ** 2 / ((4 + e * e) / 5))
    assert s.ess_sequence == pytest.approx(1.0)  # one completion


def test_unscored_tokens_are_left_out_and_nothing_to_measure_is_none():
    old, sampling, mask = make()
    with_nan = sampling.clone()
    with_nan[0, 0] = math.nan
    kept = mask.clone()
    kept[0, 0] = 0
    assert mismatch_stats(old, with_nan, mask) == mismatch_stats(old, sampling, kept)
    assert mismatch_stats(old, sampling, torch.zeros(N, T)) is None


def test_metric_names_are_under_sampling():
    names = mismatch_stats(*make()).metrics()
    assert {"sampling/token_mult_prob_error", "sampling/kl", "sampling/ess/token", "sampling/token_ratio/p95"} <= set(
        names
    )


def test_ess_extremes():
    assert normalised_ess(torch.ones(7)) == pytest.approx(1.0)
    assert normalised_ess(torch.tensor([1.0, 0, 0, 0, 0])) == pytest.approx(0.2)


# ---- the update: settings --------------------------------------------------------------------------------------


def test_bounds_default_per_correction_and_settings_override():
    assert UpdateConfig(sampling_correction="icepop").correction_bounds == (0.5, 5.0)
    assert UpdateConfig().for_engine(max_staleness=0).correction_bounds == (0.0, 3.0)  # TRL's sequence_mask, cap 3
    assert UpdateConfig(sampling_correction="decoupled", sampling_correction_max=2.0).correction_bounds == (0.0, 2.0)


def test_auto_is_bypass_for_an_engine_sampling_ahead_and_sequence_mask_otherwise():
    assert UpdateConfig().sampling_correction == "auto"
    assert UpdateConfig().for_engine(max_staleness=0).sampling_correction == "sequence_mask"
    assert UpdateConfig().for_engine(max_staleness=2).sampling_correction == "bypass"
    chosen = UpdateConfig(sampling_correction="icepop")
    assert chosen.for_engine(max_staleness=1) is chosen  # a correction named is kept
    bounded = UpdateConfig(sampling_correction_max=2.0)
    assert bounded.for_engine(max_staleness=0).correction_bounds == (0.0, 2.0)
    with pytest.raises(ValueError, match=r"'auto' is 'bypass' for an engine sampling up to 1 update\(s\) ahead"):
        bounded.for_engine(max_staleness=1)
    with pytest.raises(ValueError, match="no bounds until for_engine resolves it"):
        _ = UpdateConfig().correction_bounds


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"sampling_correction_max": 0.0}, "update.sampling_correction_max must be > 0 (None: the default), got 0.0"),
        ({"sampling_correction_min": -1.0}, "sampling_correction_min must be >= 0 (None: the default), got -1.0"),
        (
            {"sampling_correction": "icepop", "sampling_correction_min": 6.0},
            "update.sampling_correction_min must be below update.sampling_correction_max for 'icepop', got [6.0, 5.0]",
        ),
        ({"sampling_correction": "tis"}, "update.sampling_correction must be one of ['token_truncate'"),
        (
            {"sampling_correction": "bypass", "sampling_correction_max": 2.0},
            "update.sampling_correction_min/max bound a weight, and update.sampling_correction='bypass' applies none",
        ),
    ],
)
def test_bad_bounds_are_named(settings, message):
    with pytest.raises(ValueError) as err:
        UpdateConfig(**settings)
    assert message in str(err.value)


def test_percentiles_equal_torch_quantile():
    x = torch.rand(1001, generator=torch.Generator().manual_seed(0)) * 3
    qs = (0.05, 0.5, 0.95)
    assert percentiles(x, qs) == pytest.approx(torch.quantile(x, torch.tensor(qs)).tolist(), rel=1e-6)
