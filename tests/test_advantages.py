import math

import pytest
import torch

from lightning_grpo.advantages import compute_advantages, group_advantages, nanstd, zero_std_fraction


def test_group_scaling_hand_worked():
    # group [1, 0, 0, 0]: mean 0.25, unbiased std sqrt(0.75/3) = 0.5 -> (1 - 0.25) / (0.5 + 1e-4)
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), group_size=4)
    assert adv.advantages[0].item() == pytest.approx(0.75 / 0.5001, rel=1e-6)
    assert adv.advantages[1].item() == pytest.approx(-0.25 / 0.5001, rel=1e-6)
    assert adv.advantages[4:].abs().max().item() == 0.0  # constant group: no signal
    assert zero_std_fraction(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]).view(2, 4)) == 0.5


def test_none_scaling_is_mean_centred_only():
    adv = group_advantages(torch.tensor([3.0, 1.0]), group_size=2, scale_rewards="none")
    assert adv.tolist() == [1.0, -1.0]


def test_batch_scaling_uses_the_whole_batch_std():
    rewards = torch.tensor([1.0, 0.0, 5.0, 3.0])
    std = torch.std(rewards).item()  # unbiased over all 4
    adv = group_advantages(rewards, group_size=2, scale_rewards="batch")
    assert adv.tolist() == pytest.approx(
        [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 1 / (std + 1e-4), -1 / (std + 1e-4)]
    )


def test_nan_rewards_are_skipped_and_get_zero_advantage():
    # None from every function -> NaN total: left out of mean/std, advantage 0
    adv = group_advantages(torch.tensor([1.0, math.nan, 0.0]), group_size=3, scale_rewards="none")
    assert adv.tolist() == [0.5, 0.0, -0.5]


def test_not_whole_groups_is_an_error():
    with pytest.raises(ValueError, match="whole groups of num_generations=4"):
        group_advantages(torch.zeros(6), group_size=4)


def test_unknown_scale_rewards_lists_choices():
    with pytest.raises(
        ValueError, match=r"scale_rewards must be one of \['group', 'batch', 'none'\], got 'std'"
    ):
        group_advantages(torch.zeros(4), group_size=2, scale_rewards="std")


def test_nanstd_matches_torch_unbiased():
    x = torch.randn(5, 7)
    assert torch.allclose(nanstd(x, dim=1), x.std(dim=1))
