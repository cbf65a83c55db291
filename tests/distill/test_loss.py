"""The distillation objectives: GKD's generalised JSD equals TRL 1.16's ``GKDTrainer.generalized_jsd_loss`` (value and
gradient, every beta and reduction), and the reverse-KL advantage on a hand-worked case."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.distill.loss import (
    JSD_REDUCTIONS,
    distill_stats,
    generalized_jsd_loss,
    mix_advantages,
    reverse_kl_advantages,
    top_token_agreement,
)

BETAS = [0.0, 0.1, 0.5, 0.9, 1.0]  # TRL branches on 0 and 1 exactly; the rest is the mixture


def trl_jsd():
    from trl.experimental.gkd import GKDTrainer

    return GKDTrainer.generalized_jsd_loss


def logits_and_labels(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(3, 5, 11, generator=g) * 2
    teacher = torch.randn(3, 5, 11, generator=g) * 2
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, :2] = -100  # a prompt
    labels[2, 3:] = -100  # padding
    return student, teacher, labels


def value_and_grad(fn, student, teacher, **kw):
    leaf = student.clone().requires_grad_(True)
    loss = fn(leaf, teacher, **kw)
    loss.sum().backward()  # reduction "none" gives a tensor: its sum's gradient is each entry's
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", sorted(JSD_REDUCTIONS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("masked", [True, False])
def test_generalized_jsd_equals_trl(beta, reduction, temperature, masked):
    student, teacher, labels = logits_and_labels()
    kw = dict(labels=labels if masked else None, beta=beta, temperature=temperature, reduction=reduction)
    ours, our_grad = value_and_grad(generalized_jsd_loss, student, teacher, **kw)
    theirs, their_grad = value_and_grad(trl_jsd(), student, teacher, **kw)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-6, atol=1e-7)
    assert our_grad.abs().sum() > 0 or beta == 0 and reduction == "none"


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("items", [7, torch.tensor(13.0)])
def test_generalized_jsd_with_num_items_in_batch_equals_trl(beta, items):
    student, teacher, labels = logits_and_labels(1)
    kw = dict(labels=labels, beta=beta, num_items_in_batch=items)
    ours, our_grad = value_and_grad(generalized_jsd_loss, student, teacher, **kw)
    theirs, their_grad = value_and_grad(trl_jsd(), student, teacher, **kw)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(our_grad, their_grad)


def test_beta_zero_is_the_forward_kl_and_one_the_reverse_kl():
    # one position, two tokens: student (0.5, 0.5), teacher (0.8, 0.2)
    student = torch.log(torch.tensor([[[0.5, 0.5]]]))
    teacher = torch.log(torch.tensor([[[0.8, 0.2]]]))
    forward = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)  # KL(teacher || student) = 0.1927
    reverse = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # KL(student || teacher) = 0.2231
    assert generalized_jsd_loss(student, teacher, beta=0.0).item() == pytest.approx(forward, rel=1e-6)
    assert generalized_jsd_loss(student, teacher, beta=1.0).item() == pytest.approx(reverse, rel=1e-6)


def test_bad_reduction_and_beta_are_refused_by_name():
    student, teacher, _ = logits_and_labels()
    with pytest.raises(ValueError, match=r"reduction must be one of \['batchmean', 'mean', 'none', 'sum'\], got 'avg'"):
        generalized_jsd_loss(student, teacher, reduction="avg")
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\], got 1.5"):
        generalized_jsd_loss(student, teacher, beta=1.5)


def test_reverse_kl_advantage_hand_worked():
    # student p(y) = 0.5, 0.25, 0.9; teacher p(y) = 0.25, 0.5, 0.9; the third token is padding
    student = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = reverse_kl_advantages(student, teacher, mask)
    # token 1: -(log 0.5 - log 0.25) = -log 2 (the student over-rates it); token 2: +log 2; padding: 0
    torch.testing.assert_close(adv, torch.tensor([[-math.log(2), math.log(2), 0.0]]))
    stats = distill_stats(student - teacher, mask)
    assert stats.reverse_kl == pytest.approx(0.0, abs=1e-7)  # +log 2 and -log 2
    assert stats.reverse_kl_std == pytest.approx(math.log(2))
    assert stats.tokens == 2 and stats.top_agreement is None


def test_reverse_kl_advantage_drives_the_student_towards_the_teacher():
    # REINFORCE on the advantage, sampled tokens drawn from the student: the reverse KL falls
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.tensor([3.0, 0.0, -1.0, 0.5]), -1)
    logits = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=0.5)
    kl = []
    for _ in range(200):
        logp = torch.log_softmax(logits, -1)
        kl.append(float((logp.exp() * (logp - teacher)).sum().detach()))
        y = torch.multinomial(logp.exp().detach(), 64, replacement=True)  # [64] the student's samples
        adv = reverse_kl_advantages(logp[y].detach().unsqueeze(0), teacher[y].unsqueeze(0), torch.ones(1, 64))
        loss = -(adv * logp[y].unsqueeze(0)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert kl[0] > 0.5 and kl[-1] < 0.02, (kl[0], kl[-1])


def test_mix_weights_rewards_and_teacher():
    reward = torch.tensor([1.0, -1.0])  # [N] one per completion
    teacher = torch.tensor([[0.2, -0.4], [0.0, 0.6]])  # [N, T]
    mixed = mix_advantages(reward, teacher, reward_weight=0.5, teacher_weight=2.0)
    torch.testing.assert_close(mixed, torch.tensor([[0.9, -0.3], [-0.5, 0.7]]))
    torch.testing.assert_close(mix_advantages(None, teacher, 1.0, 1.0), teacher)
    torch.testing.assert_close(mix_advantages(reward, teacher, 0.0, 1.0), teacher)


def test_top_token_agreement_counts_masked_positions():
    student = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [5.0, 0.0]]])
    teacher = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    same, count = top_token_agreement(student, teacher, torch.tensor([[1.0, 1.0, 0.0]]))
    assert (same.item(), count.item()) == (1.0, 2.0)
