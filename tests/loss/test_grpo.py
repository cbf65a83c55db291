"""Hand-worked values for each loss variant, and equality with TRL 1.16's own _compute_loss."""

import math

import pytest
import torch

from lightning_grpo.loss import LOSS_TYPES, LossConfig, LossNormalizer, grpo_loss
from lightning_grpo.targets.build import loss_mask


def one_token(logp: float, old: float, adv: float, **kw):
    return grpo_loss(torch.tensor([[logp]]), torch.tensor([[old]]), torch.tensor([adv]), torch.ones(1, 1), **kw)


def test_ratio_one_gives_minus_advantage():
    # num_iterations = 1: old = logp.detach(), ratio 1, loss = -A, gradient d/dlogp = -A
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = grpo_loss(logp, None, torch.tensor([2.0]), torch.ones(1, 2), loss_type="grpo")
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2.0)
    assert logp.grad.tolist() == [[-1.0, -1.0]]  # grpo averages 2 tokens: d/dlogp = -A / 2


def test_high_ratio_is_clipped():
    # ratio e^1 ~ 2.72 with advantage +1 -> clipped at 1 + 0.2, loss = -1.2
    out = one_token(0.0, -1.0, 1.0, epsilon=0.2)
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.metrics()["clip_ratio/high_mean"] == 1.0


def test_low_ratio_is_clipped_for_negative_advantage():
    # ratio e^-1 ~ 0.37 with advantage -1: min(0.37 * -1, 0.8 * -1) = -0.8 -> loss 0.8
    out = one_token(-1.0, 0.0, -1.0, epsilon=0.2)
    assert out.loss.item() == pytest.approx(0.8)
    assert out.metrics()["clip_ratio/low_mean"] == 1.0
    assert out.metrics()["clip_ratio/region_mean"] == 1.0


def test_epsilon_high_raises_the_ceiling():
    # DAPO's clip-higher: ceiling 1 + 0.28
    assert one_token(0.0, -1.0, 1.0, epsilon=0.2, epsilon_high=0.28).loss.item() == pytest.approx(-1.28)


def test_delta_caps_the_unclipped_side():
    # ratio e^1 with advantage -1: unclipped side -2.72 would win the min; delta 1.5 caps it -> loss 1.5
    assert one_token(0.0, -1.0, -1.0, delta=1.5).loss.item() == pytest.approx(1.5)
    assert one_token(0.0, -1.0, -1.0).loss.item() == pytest.approx(math.e)


def test_k3_kl_is_added_with_beta():
    # ref - logp = 1: kl = e^1 - 1 - 1 = 0.718; ratio 1, advantage 0 -> loss = beta * kl
    out = grpo_loss(
        torch.tensor([[0.0]]),
        None,
        torch.tensor([0.0]),
        torch.ones(1, 1),
        ref_logps=torch.tensor([[1.0]]),
        beta=0.5,
    )
    assert out.loss.item() == pytest.approx(0.5 * (math.e - 2))
    assert out.metrics()["kl"] == pytest.approx(math.e - 2)


def test_sequence_level_uses_mean_log_ratio():
    # GSPO: log-ratios (1, -1) average to 0 -> ratio 1 for every token, no clipping
    logp, old = torch.tensor([[0.0, 0.0]]), torch.tensor([[-1.0, 1.0]])
    seq = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), importance_sampling_level="sequence")
    tok = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), importance_sampling_level="token")
    assert seq.loss.item() == pytest.approx(-1.0)
    assert tok.loss.item() == pytest.approx(-(1.2 + math.exp(-1)) / 2)


def test_reductions_hand_worked():
    # two completions, lengths 1 and 3, per-token loss -A with A = (1, 2): token losses -1 | -2 -2 -2
    logp = torch.zeros(2, 4)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, 2.0])
    losses = {t: grpo_loss(logp, None, adv, mask, loss_type=t).loss.item() for t in ("grpo", "bnpo", "dapo", "dr_grpo")}
    assert losses["grpo"] == pytest.approx((-1 + -2) / 2)  # mean of per-sequence means
    assert losses["bnpo"] == pytest.approx(-7 / 4)  # token mean
    assert losses["dapo"] == pytest.approx(-7 / 4)  # global token mean, one process
    assert losses["dr_grpo"] == pytest.approx(-7 / (2 * 4))  # N * max_completion_length


def test_dapo_divides_by_global_tokens_per_rank():
    norm = LossNormalizer(num_sequences=1, num_tokens=2, global_num_tokens=8, world_size=2, max_completion_length=2)
    out = grpo_loss(torch.zeros(1, 2), None, torch.tensor([1.0]), torch.ones(1, 2), normalizer=norm)
    assert out.loss.item() == pytest.approx(-2 / (8 / 2))


def test_micro_batches_add_up_to_the_full_batch():
    torch.manual_seed(0)
    logp, old = torch.randn(6, 5), torch.randn(6, 5)
    adv, mask = torch.randn(6), (torch.rand(6, 5) > 0.3).long()
    for loss_type in LOSS_TYPES:
        cfg = LossConfig(loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None)
        full = grpo_loss(logp, old, adv, mask, cfg, max_completion_length=5)
        norm = LossNormalizer.from_mask(mask, 5)
        parts = [
            grpo_loss(logp[s], old[s], adv[s], mask[s], cfg, normalizer=norm)
            for s in (slice(0, 1), slice(1, 4), slice(4, 6))
        ]
        assert sum(p.loss for p in parts).item() == pytest.approx(full.loss.item(), abs=1e-6), loss_type


def test_truncated_completions_are_masked():
    mask = loss_mask(torch.ones(2, 3, dtype=torch.long), torch.tensor([True, False]), True)
    assert mask.tolist() == [[0, 0, 0], [1, 1, 1]]
    all_truncated = loss_mask(torch.ones(2, 3), torch.tensor([True, True]), True)
    logp = torch.zeros(2, 3, requires_grad=True)
    out = grpo_loss(logp, None, torch.tensor([1.0, -1.0]), all_truncated)
    out.loss.backward()
    assert out.loss.item() == 0.0 and logp.grad.abs().sum().item() == 0.0


def test_bad_settings_name_the_choices():
    with pytest.raises(
        ValueError,
        match=r"loss_type must be one of \['bnpo', 'cispo', 'dapo', 'dr_grpo', 'grpo', 'luspo', 'sapo', 'vespo'\], "
        r"got 'ppo'",
    ):
        one_token(0.0, 0.0, 1.0, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        one_token(0.0, 0.0, 1.0, importance_sampling_level="batch")
    with pytest.raises(ValueError, match="needs ref_logps"):
        one_token(0.0, 0.0, 1.0, beta=0.1)
