"""Hand-worked values and gradients for each loss variant and option beyond the clipped four."""

import math

import pytest
import torch

from lightning_grpo.loss import LossConfig, LossNormalizer, grpo_loss
from lightning_grpo.loss.entropy import EntropyController, entropy_threshold, high_entropy_mask
from lightning_grpo.loss.grpo import off_policy_mask


def run(logps, old, adv, mask=None, **kw):
    """Loss value and d loss / d logps."""
    logps = torch.tensor(logps).requires_grad_(True)
    mask = torch.ones_like(logps) if mask is None else torch.tensor(mask, dtype=torch.float)
    out = grpo_loss(logps, None if old is None else torch.tensor(old), torch.tensor(adv), mask, **kw)
    out.loss.backward()
    return out.loss.item(), logps.grad.tolist(), out


def test_cispo_clips_a_detached_weight_not_the_gradient():
    # log-ratio 1: ratio e = 2.718 capped at 2; loss = -2 * A * logp = -2 * 1 * (-0.5) = 1, d/dlogp = -2 * A = -2
    loss, grad, out = run([[-0.5]], [[-1.5]], [1.0], loss_type="cispo", epsilon_high=2.0)
    assert loss == pytest.approx(1.0) and grad == [[pytest.approx(-2.0)]]
    assert out.metrics()["cispo_clip_ratio"] == 1.0
    # PPO's clip would give this token no gradient at all (ratio above 1 + eps with A > 0)
    assert run([[-0.5]], [[-1.5]], [1.0], loss_type="dapo")[1] == [[0.0]]
    # under the cap the weight is the ratio itself: e * 0.5 = 1.359, gradient -e
    loss, grad, _ = run([[-0.5]], [[-1.5]], [1.0], loss_type="cispo", epsilon_high=5.0)
    assert loss == pytest.approx(math.e / 2) and grad == [[pytest.approx(-math.e)]]


def test_cispo_refuses_a_cap_below_one():
    with pytest.raises(ValueError, match=r"loss_type 'cispo' caps the ratio at epsilon_high itself.*got 0.2"):
        LossConfig(loss_type="cispo")


def test_sapo_soft_gate():
    # on-policy: gate sigmoid(0) * 4 / tau = 2 / tau; slope at r = 1 is 4 * sigmoid'(0) = 1, as GRPO's
    loss, grad, _ = run([[-1.0]], None, [1.0], loss_type="sapo")
    assert loss == pytest.approx(-2.0) and grad == [[pytest.approx(-1.0)]]
    loss, grad, _ = run([[-1.0]], None, [-1.0], loss_type="sapo", sapo_temperature_neg=2.0)
    assert loss == pytest.approx(1.0) and grad == [[pytest.approx(1.0)]]  # -(2 / 2) * -1; slope still 1
    # ratio e, A = +1, tau = 1: loss = -4 sigmoid(1.718) = -3.392; d/dlogp = -4 s(1 - s) e = -1.402,
    # where the hard clip would give 0: SAPO damps off-policy tokens smoothly instead of cutting them
    s = 1 / (1 + math.exp(-(math.e - 1)))
    loss, grad, _ = run([[0.0]], [[-1.0]], [1.0], loss_type="sapo")
    assert loss == pytest.approx(-4 * s) and grad == [[pytest.approx(-4 * s * (1 - s) * math.e)]]


def test_luspo_sums_each_completion_then_averages():
    # lengths 1 and 3, on-policy, A = (1, 2): token losses -1 | -2 -2 -2 -> sums -1, -6 -> mean -3.5
    mask = [[1, 0, 0], [1, 1, 1]]
    loss, grad, _ = run([[0.0] * 3] * 2, None, [1.0, 2.0], mask, loss_type="luspo")
    assert loss == pytest.approx(-3.5)
    assert grad == [[-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]]  # -A / N per token: long completions weigh more
    assert run([[0.0] * 3] * 2, None, [1.0, 2.0], mask, loss_type="grpo")[0] == pytest.approx(-1.5)


def test_vespo_gamma_weight():
    # on-policy w = 1: phi = e^lambda * 1 * e^-lambda = 1 -> loss = -A * logp, token mean: -(-1 - 2) / 2 = 1.5
    loss, grad, out = run([[-1.0, -2.0]], None, [1.0], loss_type="vespo")
    assert loss == pytest.approx(1.5) and grad == [[-0.5, -0.5]]
    assert out.metrics()["vespo/phi_seq_mean"] == pytest.approx(1.0)
    # sequence log-ratio 0.25 + 0.25 = 0.5 (a sum, not a mean), A >= 0: k = 2, lambda = 3
    # log phi = 3 + 2 * 0.5 - 3 * e^0.5 = -0.946 -> phi = 0.388; gradient -phi * A / 2 per token
    phi = math.exp(3 + 2 * 0.5 - 3 * math.exp(0.5))
    loss, grad, _ = run([[-1.0, -2.0]], [[-1.25, -2.25]], [1.0], loss_type="vespo")
    assert loss == pytest.approx(phi * 1.5) and grad == [[pytest.approx(-phi / 2)] * 2]


def test_off_policy_mask_drops_stale_negative_sequences():
    # mean(sampling - logp): row 0 = 0.5 > 0.3 with A < 0 -> dropped; row 1 same drift but A > 0 -> kept;
    # row 2 A < 0 but drift 0.1 -> kept
    logps = torch.zeros(3, 2)
    sampling = torch.tensor([[0.4, 0.6], [0.5, 0.5], [0.1, 0.1]])
    keep = off_policy_mask(torch.tensor([-1.0, 1.0, -1.0]), logps, sampling, torch.ones(3, 2), 0.3)
    assert keep.view(-1).tolist() == [0.0, 1.0, 1.0]
    # in the loss: the dropped row contributes no gradient
    _, grad, _ = run([[0.0, 0.0]] * 3, None, [-1.0, 1.0, -1.0], off_policy_mask_threshold=0.3, sampling_logps=sampling)
    assert grad[0] == [0.0, 0.0] and grad[2] != [0.0, 0.0]


def test_bias_corrected_kl_changes_the_gradient_not_the_value():
    # on-policy, ref - logp = 1: kl = e - 2 = 0.718 either way; d kl / d logp = 1 - e = -1.718;
    # times the ratio (value 1, d/dlogp 1): (1 - e) + kl = -1.0
    kw = dict(ref_logps=torch.tensor([[1.0]]), beta=1.0, loss_type="bnpo")
    logps = torch.zeros(1, 1, requires_grad=True)
    for corrected, expected_grad in [(False, 1 - math.e), (True, -1.0)]:
        logps.grad = None
        out = grpo_loss(logps, None, torch.zeros(1), torch.ones(1, 1), use_bias_correction_kl=corrected, **kw)
        out.loss.backward()
        assert out.loss.item() == pytest.approx(math.e - 2)
        assert logps.grad.item() == pytest.approx(expected_grad)


def test_top_entropy_quantile_keeps_the_forking_tokens():
    # entropies 0..4 on five tokens (and a padded 9): the 75th percentile of the masked ones is 3 -> keep 3 and 4
    entropies = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    assert entropy_threshold(entropies, mask, 0.25).item() == 3.0
    assert high_entropy_mask(entropies, mask, 0.25).tolist() == [[0, 0, 0, 1, 1, 0]]
    assert high_entropy_mask(entropies, mask, 0.0).tolist() == [[0, 0, 0, 0, 1, 0]]  # only the highest
    assert high_entropy_mask(entropies, mask, 1.0).tolist() == [[1, 1, 1, 1, 1, 0]]
    # the loss reports the entropy of the trained tokens, (3 + 4) / 2, beside TRL's over all tokens, 10 / 5
    out = grpo_loss(torch.zeros(1, 6), None, torch.ones(1), mask, top_entropy_quantile=0.25, entropies=entropies)
    assert out.metrics()["entropy/trained_mean"] == 3.5 and out.metrics()["entropy"] == 2.0
    assert (out.trained_entropy.item(), out.trained_tokens.item()) == (7.0, 2.0)
    # in the loss (on-policy, A = 1, dapo): only tokens 3 and 4 get the gradient -1 / 5
    _, grad, _ = run([[-1.0] * 6], None, [1.0], mask[0:1].tolist(), top_entropy_quantile=0.25, entropies=entropies)
    assert grad == [[0.0, 0.0, 0.0, pytest.approx(-0.2), pytest.approx(-0.2), 0.0]]


def test_entropy_bonus_is_the_mean_entropy_times_coef():
    # A = 0: loss = -0.1 * mean(1, 3) = -0.2 whatever the loss type; d/dH = -0.1 / 2 per token
    entropies = torch.tensor([[1.0, 3.0]], requires_grad=True)
    for loss_type in ("dapo", "grpo", "dr_grpo", "luspo"):
        entropies.grad = None
        out = grpo_loss(torch.zeros(1, 2), None, torch.zeros(1), torch.ones(1, 2), loss_type=loss_type,
                        entropy_coef=0.1, entropies=entropies)  # fmt: skip
        out.loss.backward()
        assert out.loss.item() == pytest.approx(-0.2) and entropies.grad.tolist() == [[pytest.approx(-0.05)] * 2]
    with pytest.raises(ValueError, match="entropy_coef needs per-token entropies"):
        grpo_loss(torch.zeros(1, 2), None, torch.zeros(1), torch.ones(1, 2), entropy_coef=0.1)


def test_adaptive_controller_hand_worked_and_restored():
    ctl = EntropyController(coef=0.0, adaptive=True, coef_delta=0.1, coef_max=0.15, target=1.0)
    assert ctl.enabled and ctl.coef_to_apply() == 0.0  # no measurement yet
    ctl.observe(1.5, 2)  # mean 0.75 <= 1: more bonus
    ctl.update()
    assert (ctl.coef, ctl.last_entropy, ctl.coef_to_apply()) == (0.1, 0.75, 0.1)
    ctl.observe(torch.tensor(0.5), torch.tensor(1.0))  # 0.5
    ctl.update()
    assert ctl.coef == 0.15  # 0.2 capped at coef_max
    restored = EntropyController()
    restored.load_state_dict(ctl.state_dict())
    assert restored == ctl
    ctl.observe(2.0, 1)  # above target: less bonus, and none applied next step
    ctl.update()
    assert ctl.coef == pytest.approx(0.05) and ctl.coef_to_apply() == 0.0


def test_fixed_controller_never_moves():
    ctl = EntropyController(coef=0.01)
    ctl.observe(1.0, 1)
    ctl.update()
    assert ctl.coef_to_apply() == 0.01 and not EntropyController().enabled


def test_config_lists_every_problem():
    with pytest.raises(ValueError) as err:
        LossConfig(loss_type="ppo", top_entropy_quantile=1.5, sapo_temperature_neg=0.0, entropy_coef_min=2.0)
    message = str(err.value)
    assert "loss_type must be one of ['bnpo', 'cispo', 'dapo', 'dr_grpo', 'grpo', 'luspo', 'sapo', 'vespo']" in message
    assert "top_entropy_quantile must be in [0, 1], got 1.5" in message
    assert "sapo_temperature_neg must be > 0, got 0.0" in message
    assert "entropy_coef_min (2.0) must be <= entropy_coef_max (1.0)" in message
    assert message.startswith("invalid loss settings:")
    with pytest.raises(TypeError, match=r"unknown options \['epsilon_hgih'\]"):
        grpo_loss(torch.zeros(1, 1), None, torch.zeros(1), torch.ones(1, 1), epsilon_hgih=0.28)


def test_one_entropy_threshold_lets_micro_batches_add_up():
    # the threshold and trained-token count of the whole batch, given to every micro-batch, give the full loss
    torch.manual_seed(0)
    logps, old, adv = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6)
    mask, entropies = (torch.rand(6, 4) > 0.2).float(), torch.rand(6, 4) * 3
    cfg = LossConfig(loss_type="grpo", top_entropy_quantile=0.3, entropy_coef=0.1)
    full = grpo_loss(logps, old, adv, mask, cfg, entropies=entropies)
    threshold = entropy_threshold(entropies, mask, 0.3)
    norm = LossNormalizer.from_mask(mask)
    norm.num_trained_tokens = high_entropy_mask(entropies, mask, 0.3, threshold).sum().item()
    parts = [
        grpo_loss(logps[s], old[s], adv[s], mask[s], cfg, entropies=entropies[s], entropy_threshold=threshold,
                  normalizer=norm)
        for s in (slice(0, 1), slice(1, 4), slice(4, 6))
    ]  # fmt: skip
    assert sum(p.loss for p in parts).item() == pytest.approx(full.loss.item(), abs=1e-6)


@pytest.mark.parametrize(
    "settings,advice",
    [
        ({"loss_type": "luspo"}, "loss_type 'luspo' scales a sequence-level loss"),
        ({"loss_type": "vespo", "importance_sampling_level": "sequence"}, "loss_type 'vespo' computes sequence-level"),
        ({"importance_sampling_level": "sequence"}, "GSPO's paper uses loss_type 'grpo'"),
    ],
)
def test_combinations_trl_warns_about_warn_here_too(settings, advice):
    with pytest.warns(UserWarning, match=advice):
        LossConfig(**settings)
