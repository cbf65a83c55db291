"""Property tests: advantages, loss and masking hold their invariants for any shape and values."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_grpo.advantages import compute_advantages
from lightning_grpo.engines.rollout import mask_after_eos
from lightning_grpo.loss import LossNormalizer, grpo_loss
from lightning_grpo.loss.reduce import LOSS_TYPES
from lightning_grpo.targets.build import loss_mask
from lightning_grpo.types import zero_std_fraction

rewards_st = st.floats(-10, 10, allow_nan=False)


@st.composite
def grouped_rewards(draw):
    groups, size = draw(st.integers(1, 6)), draw(st.integers(2, 8))
    values = draw(st.lists(rewards_st | st.just(math.nan), min_size=groups * size, max_size=groups * size))
    return torch.tensor(values), size


@settings(max_examples=100, deadline=None)
@given(grouped_rewards(), st.sampled_from(["group", "batch", "none"]))
def test_advantages_are_finite_and_centred_per_group(data, scale):
    rewards, size = data
    adv = compute_advantages(rewards, size, scale).advantages
    assert adv.isfinite().all()
    assert (adv[rewards.isnan()] == 0).all()  # not applicable -> no signal
    for group in range(len(rewards) // size):
        r, a = rewards[group * size : (group + 1) * size], adv[group * size : (group + 1) * size]
        if (~r.isnan()).sum() >= 1:
            assert abs(a[~r.isnan()].sum().item()) < 1e-3 * max(1.0, a.abs().max().item())


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(2, 8), rewards_st)
def test_equal_rewards_give_zero_advantage(groups, size, value):
    adv = compute_advantages(torch.full((groups * size,), value), size)
    # float32 means of equal values can miss by an ulp; advantages are computed in float64 so that the miss
    # does not become a same-sign advantage for the whole group
    assert adv.advantages.abs().max() < 1e-8
    assert zero_std_fraction(torch.full((groups, size), value)) == 1.0


def cispo_cap(loss_type: str) -> float | None:
    return 5.0 if loss_type == "cispo" else None  # cispo caps the ratio at epsilon_high itself


@st.composite
def loss_inputs(draw):
    n, t = draw(st.integers(1, 6)), draw(st.integers(1, 7))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    lengths = torch.tensor(draw(st.lists(st.integers(0, t), min_size=n, max_size=n)))
    mask = (torch.arange(t)[None] < lengths[:, None]).long()  # [n, T], empty and single-token rows included
    logps = -torch.rand(n, t, generator=gen) * 3
    old = logps + torch.randn(n, t, generator=gen) * 0.3
    return logps, old, torch.randn(n, generator=gen), mask


@settings(max_examples=100, deadline=None)
@given(loss_inputs(), st.sampled_from(sorted(LOSS_TYPES)), st.sampled_from(["token", "sequence"]))
def test_loss_is_finite_and_micro_batches_add_up(inputs, loss_type, level):
    logps, old, adv, mask = inputs
    kw = dict(loss_type=loss_type, importance_sampling_level=level, epsilon_high=cispo_cap(loss_type))
    full = grpo_loss(logps, old, adv, mask, max_completion_length=mask.shape[1], **kw)
    assert full.loss.isfinite()
    norm = LossNormalizer.from_mask(mask, mask.shape[1])
    parts = sum(
        grpo_loss(logps[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], normalizer=norm, **kw).loss
        for i in range(len(adv))
    )
    assert abs(parts.item() - full.loss.item()) < 1e-5


@settings(max_examples=50, deadline=None)
@given(loss_inputs(), st.sampled_from(sorted(LOSS_TYPES)))
def test_all_truncated_batch_has_zero_loss_and_gradient(inputs, loss_type):
    logps, old, adv, mask = inputs
    logps = logps.clone().requires_grad_(True)
    masked = loss_mask(mask, torch.ones(len(adv), dtype=torch.bool), mask_truncated_completions=True)
    out = grpo_loss(
        logps, old, adv, masked, loss_type=loss_type, ref_logps=old, beta=0.1, epsilon_high=cispo_cap(loss_type)
    )
    out.loss.backward()
    assert out.loss.item() == 0.0 and (logps.grad == 0).all()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=1, max_size=5).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
def test_eos_mask_is_a_prefix_ending_at_the_first_eos(rows):
    ids = torch.tensor(rows)  # eos = 1
    mask, truncated = mask_after_eos(ids, [1])
    for row, m, cut in zip(rows, mask.tolist(), truncated.tolist()):
        first = row.index(1) if 1 in row else None
        assert m == [1] * (len(row) if first is None else first + 1) + [0] * (
            0 if first is None else len(row) - first - 1
        )
        assert cut == (first is None)
