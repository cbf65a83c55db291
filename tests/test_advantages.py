import math
from collections import defaultdict

import pytest
import torch

from lightning_grpo.advantages import (
    TokenRewards,
    compute_advantages,
    group_advantages,
    kl_penalty,
    multi_objective_advantages,
)
from lightning_grpo.types import nanstd, zero_std_fraction


def test_group_scaling_hand_worked():
    # group [1, 0, 0, 0]: mean 0.25, unbiased std sqrt(0.75/3) = 0.5 -> (1 - 0.25) / (0.5 + 1e-4)
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), group_size=4)
    assert adv.advantages[0].item() == pytest.approx(0.75 / 0.5001, rel=1e-6)
    assert adv.advantages[1].item() == pytest.approx(-0.25 / 0.5001, rel=1e-6)
    assert adv.advantages[4:].abs().max().item() == 0.0  # constant group: no signal


def test_none_scaling_is_mean_centred_only():
    adv = group_advantages(torch.tensor([3.0, 1.0]), group_size=2, scale_rewards="none")
    assert adv.tolist() == [1.0, -1.0]


def test_batch_scaling_uses_the_whole_batch_std():
    rewards = torch.tensor([1.0, 0.0, 5.0, 3.0])
    std = torch.std(rewards).item()  # unbiased over all 4
    adv = group_advantages(rewards, group_size=2, scale_rewards="batch")
    assert adv.tolist() == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 1 / (std + 1e-4), -1 / (std + 1e-4)])


def test_nan_rewards_are_skipped_and_get_zero_advantage():
    # None from every function -> NaN total: left out of mean/std, advantage 0
    adv = group_advantages(torch.tensor([1.0, math.nan, 0.0]), group_size=3, scale_rewards="none")
    assert adv.tolist() == [0.5, 0.0, -0.5]


def test_not_whole_groups_is_an_error():
    with pytest.raises(ValueError, match="whole groups of num_generations=4"):
        group_advantages(torch.zeros(6), group_size=4)


def test_unknown_scale_rewards_lists_choices():
    with pytest.raises(ValueError, match=r"scale_rewards must be one of \['group', 'batch', 'none'\], got 'std'"):
        group_advantages(torch.zeros(4), group_size=2, scale_rewards="std")


def test_nanstd_matches_torch_unbiased():
    x = torch.randn(5, 7)
    assert torch.allclose(nanstd(x, dim=1), x.std(dim=1))


# ---- estimators besides GRPO's, multi-objective aggregation -------------------------------------------------


def test_rloo_leave_one_out_hand_worked():
    # group [1, 0, 0, 0]: A_0 = 1 - mean(0, 0, 0) = 1, A_1 = 0 - mean(1, 0, 0) = -1/3; = 4/3 * (r - 0.25)
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, adv_estimator="rloo").advantages
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # a NaN reward is out of the baseline: valid [1, 0] -> [1, -1]; a lone valid completion gets 0
    adv = compute_advantages(torch.tensor([1.0, math.nan, 0.0, 5.0, math.nan, math.nan]), 3, adv_estimator="rloo")
    assert adv.advantages.tolist() == [1.0, 0.0, -1.0, 0.0, 0.0, 0.0]


def verl_rloo(scores, index):
    """verl's compute_rloo_outcome_advantage (core_algos.py), its loop transcribed, on sequence scores."""
    id2score, id2mean = defaultdict(list), {}
    scores = scores.clone()
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        id2mean[idx] = torch.mean(torch.stack(id2score[idx])) if len(id2score[idx]) > 1 else torch.tensor(0.0)
    for i in range(len(scores)):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores


def verl_masked_whiten(values, mask):
    """verl.utils.torch_functional.masked_whiten (unbiased masked variance), transcribed."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    """verl's compute_reinforce_plus_plus_outcome_advantage, transcribed."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    return verl_masked_whiten(returns, response_mask) * response_mask


def verl_token_level_rewards(scores, mask, kl, kl_coef):
    """The score on the last response token (verl's reward manager), minus kl_coef * KL (apply_kl_penalty)."""
    rewards = torch.zeros_like(kl)
    lengths = mask.sum(-1).long()
    rewards[torch.arange(len(scores)), lengths - 1] = scores
    return rewards - kl_coef * kl * mask


def random_batch(seed=0, n=8, t=5):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).double()  # right-padded
    return torch.randn(n, generator=gen).double(), mask, torch.randn(n, t, generator=gen).double().abs() * 0.1


def test_rloo_equals_verl():
    scores = random_batch()[0]
    ours = compute_advantages(scores, 4, adv_estimator="rloo").advantages
    assert torch.allclose(ours, verl_rloo(scores, [0] * 4 + [1] * 4))


@pytest.mark.parametrize("kl_coef,gamma", [(0.0, 1.0), (0.5, 1.0), (0.5, 0.9)])
def test_reinforce_pp_equals_verl(kl_coef, gamma):
    scores, mask, kl = random_batch(1)
    tokens = TokenRewards(mask, kl, kl_coef, gamma)
    ours = compute_advantages(scores, 4, adv_estimator="reinforce_plus_plus", tokens=tokens).advantages
    expected = verl_reinforce_pp(verl_token_level_rewards(scores, mask, kl, kl_coef), mask, gamma)
    assert ours.shape == (8, 5) and torch.allclose(ours, expected)


def test_reinforce_pp_hand_worked():
    # rewards (1, 0), lengths 2 and 1, no KL: returns [[1, 1], [0, pad]]; masked mean 2/3, unbiased var 1/3
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = compute_advantages(
        torch.tensor([1.0, 0.0]), 2, adv_estimator="reinforce_plus_plus", tokens=TokenRewards(mask)
    ).advantages
    s = math.sqrt(1 / 3)
    assert adv.view(-1).tolist() == pytest.approx([(1 / 3) / s, (1 / 3) / s, (-2 / 3) / s, 0.0], abs=1e-6)
    # KL in the reward: kl_coef 0.5, kl [[0.2, 0.4], [1.0, -]] -> token rewards [[-0.1, 0.8], [-0.5, 0]]:
    # returns [[0.7, 0.8], [-0.5, 0]] (each token's return is the reward-to-go), then whitened
    kl = torch.tensor([[0.2, 0.4], [1.0, 0.0]])
    adv = compute_advantages(
        torch.tensor([1.0, 0.0]), 2, adv_estimator="reinforce_plus_plus", tokens=TokenRewards(mask, kl, 0.5)
    ).advantages
    returns = torch.tensor([0.7, 0.8, -0.5]).double()
    expected = (returns - returns.mean()) / returns.std()
    assert adv[mask.bool()].tolist() == pytest.approx(expected.tolist(), abs=1e-6)


def test_reinforce_pp_baseline_equals_verl():
    scores, mask, kl = random_batch(2)
    tokens = TokenRewards(mask, kl, 0.3)
    ours = compute_advantages(scores, 4, adv_estimator="reinforce_plus_plus_baseline", tokens=tokens).advantages
    # verl: token_level_rewards.sum(-1) = score - kl_coef * sum(kl), minus its group mean, tiled, whitened
    seq = verl_token_level_rewards(scores, mask, kl, 0.3).sum(-1)
    centred = seq - seq.view(-1, 4).mean(1).repeat_interleave(4)
    expected = verl_masked_whiten(centred.unsqueeze(-1) * mask, mask) * mask
    assert torch.allclose(ours, expected)


def test_token_estimators_need_tokens_and_known_names():
    with pytest.raises(ValueError, match="'reinforce_plus_plus' works on tokens"):
        compute_advantages(torch.zeros(4), 2, adv_estimator="reinforce_plus_plus")
    with pytest.raises(ValueError, match=r"adv_estimator must be one of \['grpo', 'reinforce_plus_plus', "):
        compute_advantages(torch.zeros(4), 2, adv_estimator="gae")
    with pytest.raises(ValueError, match="kl_penalty must be one of"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k9")
    # k1 and k3 of logp -1 vs ref -2: 1 and e^-1 + 1 - 1 = 0.368
    assert kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == 1.0
    assert kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0]), "low_var_kl").item() == pytest.approx(math.exp(-1))


def trl_multi_objective(rewards_per_func, weights, num_generations, aggregation, scale_rewards="group"):
    """TRL 1.16 _generate_and_score_completions' advantage lines (grpo_trainer.py ~2755-2810), transcribed."""
    from trl.trainer.utils import nanstd as trl_nanstd

    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
        if scale_rewards == "batch":
            std = trl_nanstd(rewards).expand_as(rewards)
        else:
            std = trl_nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations)
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + 1e-4)
    else:
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = trl_nanstd(grouped, dim=1, keepdim=True)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[1])
        rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        advantages = (rewards - torch.nanmean(rewards)) / (trl_nanstd(rewards).expand_as(rewards) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def scores_with_nones(seed=0):
    gen = torch.Generator().manual_seed(seed)
    per_function = torch.randn(12, 3, generator=gen).double()
    per_function[torch.rand(12, 3, generator=gen) < 0.25] = math.nan  # some functions said None
    per_function[5] = math.nan  # every function said None
    return per_function, torch.tensor([1.0, 0.5, 2.0]).double()


@pytest.mark.parametrize(
    "aggregation,scale",
    [("sum_then_normalize", "group"), ("sum_then_normalize", "batch"), ("sum_then_normalize", "none")]
    + [("normalize_then_sum", "group")],  # GDPO has no scale_rewards
)
def test_multi_objective_equals_trl(aggregation, scale):
    per_function, weights = scores_with_nones()
    ours = multi_objective_advantages(per_function, weights, 4, aggregation, scale).advantages
    expected = trl_multi_objective(per_function, weights, 4, aggregation, scale)
    assert torch.allclose(ours, expected)
    assert ours[5] == 0.0


def test_gdpo_hand_worked():
    # one group of 3, f1 = (1, 0, 0) and f2 = (0, 0, 10). Summed: (1, 0, 10), mean 3.67 -> row 0 below average.
    # GDPO: f1 -> (2, -1, -1) / 3 / 0.577 = (1.155, -0.577, -0.577); f2 -> (-0.577, -0.577, 1.155);
    # sum (0.577, -1.155, 0.577), batch mean 0, std 1 -> row 0 is rewarded for what f1 asked
    per_function = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 10.0]])
    weights = torch.ones(2)
    gdpo = multi_objective_advantages(per_function, weights, 3, "normalize_then_sum").advantages
    s3 = 1 / math.sqrt(3)
    assert gdpo.tolist() == pytest.approx([s3, -2 * s3, s3], rel=1e-3)
    summed = multi_objective_advantages(per_function, weights, 3, "sum_then_normalize").advantages
    assert summed[0] < 0 < summed[2]
    with pytest.raises(ValueError, match="'normalize_then_sum' \\(GDPO\\) works with adv_estimator 'grpo' only"):
        multi_objective_advantages(per_function, weights, 2, "normalize_then_sum", adv_estimator="rloo")
    with pytest.raises(ValueError, match=r"multi_objective_aggregation must be one of \['sum_then_normalize', "):
        multi_objective_advantages(per_function, weights, 2, "mean")


def test_zero_std_fraction():
    # float32 rewards of 3.8 are equal; a group with one valid reward has no spread either
    groups = torch.tensor([[3.8, 3.8, 3.8], [0.0, 1.0, 0.0], [math.nan, 2.0, math.nan]])
    assert zero_std_fraction(groups) == pytest.approx(2 / 3)


# Two 2-turn episodes of one group: model turn, tool reply (out of the loss), model turn; rewards 1 and 0
TWO_TURNS = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
STD_OF_8 = math.sqrt(8 * 0.25 / 7)  # eight model tokens at +-0.5 around their mean: unbiased std 0.5345
MULTI_TURN = {  # the advantage of every model token of episode 1 (episode 2's is its negative)
    "grpo": 0.5 / (math.sqrt(0.5) + 1e-4),  # (1 - 0.5) / (group std 0.7071 + 1e-4) = 0.7070
    "rloo": 1.0,  # 1 - the other's 0
    "reinforce_plus_plus": 0.5 / STD_OF_8,  # returns 1 on all four model tokens, 0 on the other's: +-0.9354
    "reinforce_plus_plus_baseline": 0.5 / STD_OF_8,  # +-0.5 centred on every model token, whitened: +-0.9354
}


@pytest.mark.parametrize("estimator", sorted(MULTI_TURN))
def test_the_outcome_reaches_every_turn_of_a_multi_turn_episode(estimator):
    """Before, reinforce_plus_plus reset its return at the tool reply: the first turn got -0.54 whatever the
    outcome, the last +1.62 or -0.54."""
    out = compute_advantages(torch.tensor([1.0, 0.0]), 2, adv_estimator=estimator, tokens=TokenRewards(TWO_TURNS))
    adv = out.advantages if out.advantages.dim() == 2 else out.advantages.unsqueeze(1) * TWO_TURNS  # [2, 6]
    a = MULTI_TURN[estimator]
    expected = torch.tensor([[a, a, 0, 0, a, a], [-a, -a, 0, 0, -a, -a]]).double()
    assert (adv * TWO_TURNS).flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-4)


def test_reinforce_pp_discounts_model_tokens_only():
    """gamma 0.5: each model token's return halves per model token to the end; the tool reply takes no step."""
    tokens = TokenRewards(TWO_TURNS, gamma=0.5)
    adv = compute_advantages(torch.tensor([1.0, 0.0]), 2, adv_estimator="reinforce_plus_plus", tokens=tokens)
    returns = torch.tensor([0.125, 0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0]).double()  # model tokens, in order
    expected = (returns - returns.mean()) / returns.std()
    assert adv.advantages[TWO_TURNS.bool()].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
