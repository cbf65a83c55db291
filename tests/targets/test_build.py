"""targets/: a scored rollout -> what the loss is computed against, each piece computed once, advantages inside."""

import math
from dataclasses import replace

import lightning as L
import pytest
import torch

from lightning_grpo import AdvantageConfig, SamplingConfig, UpdateConfig, compute_advantages
from lightning_grpo.engines import HFGenerate
from lightning_grpo.loss import LossConfig, LossNormalizer
from lightning_grpo.model.policy import Policy
from lightning_grpo.ranks import Ranks
from lightning_grpo.seeding import seeded
from lightning_grpo.targets import Targets, TargetSettings, build_targets
from lightning_grpo.targets.build import loss_mask, split_rows, token_micro_batches
from lightning_grpo.targets.correction import sampling_correction
from lightning_grpo.types import RewardScores
from lightning_grpo.update import optimiser_steps


@pytest.fixture(scope="module")
def one_rank():
    return Ranks(L.Trainer(accelerator="cpu", devices=1, logger=False))


@pytest.fixture(scope="module")
def sampled(tiny_model_dir):
    policy = Policy(tiny_model_dir, reference=True)
    with seeded(0, policy.device):
        rollout = HFGenerate().generate(policy, ["1+2=", "3+0="], 4, SamplingConfig(max_completion_length=6), False)
    scores = RewardScores(torch.tensor([[1.0], [0.0], [0.5], [0.0], [1.0], [1.0], [0.0], [0.25]]), ["r"], torch.ones(1))
    return policy, rollout, scores


def settings(update=None, advantages=None, reference=False, group_size=4):
    return TargetSettings(update or UpdateConfig(), advantages or AdvantageConfig(), group_size, 6, reference)


def test_advantages_are_computed_with_the_targets_never_later(sampled, one_rank):
    policy, rollout, scores = sampled
    targets = build_targets(policy, rollout, scores, scores.per_function, settings(), one_rank)
    expected = compute_advantages(scores.total, 4).advantages
    torch.testing.assert_close(targets.advantages, expected)
    assert targets.old_logps is None and targets.ref_logps is None  # on-policy, no KL: nothing else to compute


def test_off_policy_steps_and_a_reference_get_their_log_probs(sampled, one_rank):
    policy, rollout, scores = sampled
    s = settings(UpdateConfig(num_iterations=2), reference=True)
    targets = build_targets(policy, rollout, scores, scores.per_function, s, one_rank)
    shape = rollout.completion_ids.shape
    assert targets.old_logps.shape == shape and targets.ref_logps.shape == shape
    torch.testing.assert_close(targets.old_logps, targets.ref_logps)  # no update yet: policy == reference


def test_reinforce_pp_kl_in_the_reward_uses_the_sampling_policy_even_on_policy(sampled, one_rank):
    policy, rollout, scores = sampled
    a = AdvantageConfig(adv_estimator="reinforce_plus_plus", kl_coef=0.1)
    targets = build_targets(
        policy, rollout, scores, scores.per_function, settings(advantages=a, reference=True), one_rank
    )
    assert targets.advantages.shape == rollout.completion_ids.shape  # per-token returns
    assert targets.old_logps is None  # computed for the KL, not kept: every optimiser step is on-policy


def corrected(sampled, one_rank, update: UpdateConfig):
    """Targets for a rollout whose sampler gave each token e^0.5 less probability than the policy."""
    policy, rollout, scores = sampled
    old = policy.logps(rollout, [slice(None)])
    rollout.sampling_logps = old - 0.5 * rollout.completion_mask
    try:
        return build_targets(policy, rollout, scores, scores.per_function, settings(update), one_rank)
    finally:
        rollout.sampling_logps = None


def trained(policy, rollout, targets, micro_batches):
    """The loss and gradient of one optimiser step, micro-batch by micro-batch, as the module runs it."""
    policy.model.zero_grad()
    total = 0.0
    for rows in micro_batches:
        out = targets.loss(policy.train_logps(rollout, rows), rows, targets.normalizer, LossConfig(), 0.0)
        out.loss.backward()
        total += out.loss.item()
    return total, [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_another_engines_samples_get_correction_weights(sampled, one_rank, num_iterations):
    """Off-policy steps (``num_iterations: 2``) weigh against a no-grad forward made up front; one update per batch
    weighs against the training forward itself, and the weights and mismatch are known once it has run."""
    policy, rollout, _ = sampled
    update = UpdateConfig(sampling_correction="token_truncate", sampling_correction_max=10.0, num_iterations=2)
    targets = corrected(sampled, one_rank, replace(update, num_iterations=num_iterations))
    assert (targets.proximal is None) == (num_iterations == 2)
    if num_iterations == 1:
        assert targets.sampling_weights is None and targets.mismatch is None  # not yet: no forward has run
        trained(policy, rollout, targets, [slice(0, 3), slice(3, 8)])
        targets = targets.settled(one_rank)
    mask = targets.mask.bool()
    torch.testing.assert_close(targets.sampling_weights[mask], torch.full((int(mask.sum()),), 0.5).exp())
    assert targets.metrics()["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(0.5), rel=1e-5)
    assert targets.mismatch.metrics()["sampling/sampling_logp_difference/mean"] == pytest.approx(0.5, rel=1e-4)
    assert targets.sampling_logps is not None  # the off-policy mask compares with the sampler, as TRL does


def test_weights_from_the_training_forward_give_the_update_of_a_separate_forward(sampled, one_rank):
    """The same loss and gradient as weights computed from a no-grad forward first (TRL's and verl's way)."""
    policy, rollout, _ = sampled
    targets = corrected(sampled, one_rank, UpdateConfig(sampling_correction="sequence_mask"))
    with torch.no_grad():
        old = policy.logps(rollout, [slice(None)])
    weights = sampling_correction(old, old - 0.5 * rollout.completion_mask, targets.mask, "sequence_mask")
    separate = replace(targets, proximal=None, sampling_weights=weights)
    loss, grads = trained(policy, rollout, targets, [slice(0, 5), torch.tensor([7, 5, 6])])
    loss_separate, grads_separate = trained(policy, rollout, separate, [slice(0, 5), torch.tensor([7, 5, 6])])
    assert loss == pytest.approx(loss_separate, rel=1e-6)
    for g, h in zip(grads, grads_separate):
        torch.testing.assert_close(g, h)


def test_bypass_anchors_the_ratio_and_clip_at_the_sampler(sampled, one_rank):
    """``bypass`` (verl's bypass_mode): no weight; the loss is PPO's clipped surrogate with the sampler's
    log-probs as the old ones, value and gradient, written here as verl's vanilla policy loss (token-mean)."""
    policy, rollout, _ = sampled
    targets = corrected(sampled, one_rank, UpdateConfig(sampling_correction="bypass"))
    rows = [slice(0, 3), slice(3, 8)]
    loss, grads = trained(policy, rollout, targets, rows)
    settled = targets.settled(one_rank)
    assert settled.sampling_weights is None and settled.metrics()["sampling/sampling_logp_difference/mean"] > 0.49

    policy.model.zero_grad()
    current = policy.train_logps(rollout, slice(None)).logps
    sampler = current.detach() - 0.5 * rollout.completion_mask  # as corrected() made it
    ratio, adv, mask = (current - sampler).exp(), targets.advantages.unsqueeze(-1), targets.mask
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))  # e^0.5 > 1.2: clipped where adv > 0
    expected = (per_token * mask).sum() / mask.sum()
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for g, h in zip(grads, [p.grad for p in policy.model.parameters() if p.grad is not None]):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
    assert (targets.advantages > 0).any() and (targets.advantages < 0).any()  # both sides of the clip are taken


def test_truncated_completions_leave_the_loss_only_when_asked():
    mask = loss_mask(torch.ones(2, 3, dtype=torch.long), torch.tensor([True, False]), True)
    assert mask.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert loss_mask(torch.ones(2, 3), torch.tensor([True, False]), False).sum() == 6


class OneRank:
    world_size = 1

    def most(self, n):
        return n

    def sum(self, t):
        return t


def test_optimiser_steps_split_the_batch_into_shuffled_whole_groups():
    mask = torch.ones(12, 5)
    mask[3, 2:] = 0
    targets = Targets(torch.zeros(12), mask, LossNormalizer.from_mask(mask), [slice(0, 12)], None, None, None)
    torch.manual_seed(0)
    s = settings(UpdateConfig(steps_per_generation=3, micro_batch_size=3), group_size=2)
    steps = optimiser_steps(targets, s, OneRank())
    rows = [step.rows.tolist() for step in steps]
    assert sorted(r for part in rows for r in part) == list(range(12))  # every row once
    assert all(len(part) == 4 and all(part[i] // 2 == part[i + 1] // 2 for i in (0, 2)) for part in rows)
    assert rows != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # shuffled groups, as TRL shuffles
    for step in steps:  # each step is normalised by its own tokens, in micro-batches of at most 3 rows
        assert step.normalizer.num_tokens == mask[step.rows].sum().item()
        assert [len(m) for m in step.micro_batches] == [3, 1]
    with pytest.raises(ValueError, match=r"update.steps_per_generation=4 must divide the prompts .* \(6\)"):
        optimiser_steps(targets, settings(UpdateConfig(steps_per_generation=4), group_size=2), OneRank())


def test_token_micro_batches_sort_rows_and_keep_groups_whole():
    tokens = [(0, n) for n in (5, 30, 6, 7, 40, 8, 9, 10)]
    rows = token_micro_batches(tokens, budget=40)
    assert [m.tolist() for m in rows] == [[4], [1], [7, 6, 5, 3], [2, 0]]  # 4 x 10 = 40 fits; 5 x 10 does not
    assert sorted(torch.cat(rows).tolist()) == list(range(8))
    groups = token_micro_batches(tokens, budget=80, unit=2)  # groups' longest rows: 30, 7, 40, 10
    assert [m.tolist() for m in groups] == [[4, 5], [0, 1], [6, 7, 2, 3]]  # 2 groups x 2 rows x 10 = 40 fit


def test_every_rank_runs_as_many_token_micro_batches():
    """A rank whose rows fit in fewer passes splits them further: each pass is a collective under DDP and FSDP2."""

    class MoreOnAnotherRank(OneRank):
        def most(self, n):
            return 4

    tokens = [(0, n) for n in (5, 30, 6, 7, 40, 8, 9, 10)]
    u = UpdateConfig(micro_batch_tokens=80)  # groups of 2 rows, longest 40, 30, 10, 7: 3 passes here
    rows = split_rows(tokens, u, unit=2, ranks=OneRank())
    assert [r.tolist() for r in rows] == [[4, 5], [0, 1], [6, 7, 2, 3]]
    evened = split_rows(tokens, u, unit=2, ranks=MoreOnAnotherRank())
    assert [r.tolist() for r in evened] == [[4, 5], [0, 1], [6, 7], [2, 3]]  # whole groups still


def test_the_default_token_budget_splits_only_batches_over_16384_tokens():
    """``micro_batch_tokens: auto``: a batch of up to 16384 padded tokens is one pass (a slice, as before); a longer
    one is split by length, whole groups kept; ``micro_batch_size`` or ``None`` turns it off."""
    u = UpdateConfig()
    assert u.micro_batch_tokens == "auto" and u.token_budget == 16384
    assert (
        UpdateConfig(micro_batch_size=4).token_budget is None
        and UpdateConfig(micro_batch_tokens=None).token_budget is None
    )
    short = [(24, 1000)] * 16  # 16 x 1024 = 16384: one pass
    assert split_rows(short, u, unit=8, ranks=OneRank()) == [slice(0, 16)]
    long = [(80, 2000)] * 8 + [(100, 200)] * 8  # a group of 2,080-token rows (16,640 > 16384) and a short one
    assert [r.tolist() for r in split_rows(long, u, unit=8, ranks=OneRank())] == [list(range(8)), list(range(8, 16))]
    assert split_rows(long, UpdateConfig(micro_batch_tokens=None), unit=8, ranks=OneRank()) == [slice(0, 16)]
    with pytest.raises(
        ValueError, match="update.micro_batch_tokens must be an integer >= 1, 'auto' or None, got 'big'"
    ):
        UpdateConfig(micro_batch_tokens="big")
    assert UpdateConfig(micro_batch_size=4).micro_batch_size == 4  # with the default budget: no conflict


def test_optimiser_steps_split_by_tokens():
    mask = torch.ones(8, 5)
    tokens = [5, 30, 6, 7, 40, 8, 9, 10]
    lengths = [(0, n) for n in tokens]
    targets = Targets(torch.zeros(8), mask, LossNormalizer.from_mask(mask), [], None, None, None, row_lengths=lengths)
    s = settings(UpdateConfig(steps_per_generation=2, micro_batch_tokens=40), group_size=2)
    for step in optimiser_steps(targets, s, OneRank()):
        assert sorted(torch.cat(step.micro_batches).tolist()) == sorted(step.rows.tolist())
        for micro in step.micro_batches:
            assert len(micro) * max(tokens[i] for i in micro.tolist()) <= 40 or len(micro) == 1


def test_a_long_prompt_beside_a_long_completion_is_planned_as_the_padded_forward_holds_it():
    """Rows of 44 tokens each: 5 with a 40-token prompt, 5 with a 40-token completion. Planned as rows x the longest
    row, all 10 fit a 450-token budget (440); the padded forward holds 10 x (40 + 40) = 800."""
    lengths = [(40, 4)] * 5 + [(4, 40)] * 5
    plan = token_micro_batches(lengths, budget=450)
    for micro in plan:
        rows = [lengths[i] for i in micro.tolist()]
        assert len(rows) * (max(p for p, _ in rows) + max(c for _, c in rows)) <= 450
    assert sorted(torch.cat(plan).tolist()) == list(range(10))
    assert [len(m) for m in plan] == [5, 5]  # each kind alone: 5 x 44 = 220


def test_update_settings_check_themselves():
    with pytest.raises(ValueError) as err:
        UpdateConfig(num_iterations=0, sampling_correction="clip", sampling_correction_max=0)
    text = str(err.value)
    with pytest.raises(ValueError, match="update.micro_batch_size=4 and update.micro_batch_tokens=512 both split"):
        UpdateConfig(micro_batch_size=4, micro_batch_tokens=512)
    assert "update.num_iterations must be >= 1, got 0" in text and "got 'clip'" in text and "_max must be > 0" in text
