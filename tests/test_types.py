"""types/: the shared reward rules (one weighted sum, one zero-signal rule), Rollout's own bookkeeping, HostRows."""

import pytest
import torch
from helpers import make_rollout

from lightning_grpo.callbacks import ModeCollapseAlert
from lightning_grpo.groups import GroupBuffer
from lightning_grpo.metrics import StepCounters, StepValues, step_stats
from lightning_grpo.types import (
    SIGNAL_ATOL,
    HostRows,
    RewardScores,
    Rollout,
    StepRecord,
    UpdateStats,
    weighted_total,
    without_signal,
    zero_std_fraction,
)


def scores_of(totals):
    return RewardScores(torch.tensor(totals).unsqueeze(1), ["r"], torch.ones(1))


def test_a_group_with_std_1e_12_has_no_signal_for_the_metric_the_alert_and_filter_groups():
    # group 1: [0, 1e-12] (std 7e-13, under SIGNAL_ATOL = 1e-8), group 2: [0, 1] (std 0.71)
    rollout, scores = make_rollout(["a", "b", "c", "d"]), scores_of([0.0, 1e-12, 0.0, 1.0])
    assert scores.groups_without_signal(2).tolist() == [True, False] and 1e-12 < SIGNAL_ATOL

    lengths = (torch.full((4,), 2), torch.zeros(4, dtype=torch.bool))
    values = StepValues(rollout, scores, scores.per_function, lengths, UpdateStats(loss=0.0, entropy=1.0), 1e-3, 0.1)
    stats = step_stats(values, StepCounters())
    assert stats.rewards.frac_zero_std == 0.5  # the logged train/frac_reward_zero_std

    buffer = GroupBuffer(pad_id=0)
    buffer.add(rollout, scores)
    assert buffer.rollout.completions == ["c", "d"]  # filter_groups keeps only the group with signal

    alert, record = ModeCollapseAlert(warmup_steps=1, max_frac_zero_std=0.4), StepRecord(rollout, scores, None, stats)
    assert alert.signals(None, record) == []  # the warm-up step measures the early entropy and length
    found = {s.name: s.value for s in alert.signals(None, record)}
    assert found["frac_reward_zero_std"] == 0.5  # the alert counts the same groups


def test_without_signal_ignores_missing_rewards_and_needs_two():
    grouped = torch.tensor([[1.0, float("nan"), 1.0], [float("nan"), 2.0, float("nan")], [0.0, float("nan"), 3.0]])
    assert without_signal(grouped).tolist() == [True, True, False]
    assert zero_std_fraction(grouped) == pytest.approx(2 / 3)


def test_the_weighted_total_skips_functions_that_did_not_apply():
    per_function = torch.tensor([[1.0, 2.0], [float("nan"), 2.0], [float("nan"), float("nan")]])
    total = weighted_total(per_function, torch.tensor([0.5, 2.0]))
    assert total[:2].tolist() == [4.5, 4.0] and total[2].isnan()


def test_rollout_from_token_lists_pads_prompts_left_and_completions_right():
    rollout = Rollout.from_token_lists(
        [[5], [6, 7]], [[1, 2, 3], [4]], pad_id=0, is_truncated=[False, True],
        sampling_logps=[[-0.1, -0.2, -0.3], [-0.4]], tool_mask=[[1, 0, 1], [1]],
        prompts=["p", "q"], completions=["x", "y"], group_size=2,
    )  # fmt: skip
    assert rollout.prompt_ids.tolist() == [[0, 5], [6, 7]] and rollout.prompt_mask.tolist() == [[0, 1], [1, 1]]
    assert rollout.completion_ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert rollout.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert rollout.tool_mask.tolist() == [[1, 0, 1], [1, 0, 0]] and rollout.is_truncated.tolist() == [False, True]
    assert rollout.sampling_logps[1].tolist() == pytest.approx([-0.4, 0.0, 0.0])


def test_a_rollouts_host_rows_are_the_same_read_from_the_device_or_built_from_token_lists():
    """An engine that builds its rollout from token lists gives its host rows without a read; they equal those read
    back from the padded tensors (what ``Rollout.host`` reads for any other rollout)."""
    prompts, completions = [[5], [6, 7], [5], [6, 7, 8]], [[1, 2, 3], [4], [], [9, 9]]
    fields = {"prompts": ["p"] * 4, "completions": ["x"] * 4, "group_size": 2}
    built = Rollout.from_token_lists(prompts, completions, pad_id=0, is_truncated=[False] * 4, **fields)
    read = HostRows.read(built.prompt_ids, built.prompt_mask, built.completion_ids, built.completion_mask)
    assert built.host == read
    assert read.prompt_of == [0, 1, 0, 3] and read.completion_end == [3, 1, 0, 2]
    assert read.lengths == [(1, 3), (2, 1), (1, 0), (3, 2)]
    assert read.prompt_start == [2, 1, 2, 0] and read.columns([0, 2]) == (2, 3) and read.runs([0, 2, 1]) == [2, 1]


def test_rollout_select_and_cat_keep_every_per_row_field():
    a = make_rollout(["x", "y", "z", "w"])
    a.columns = {"answer": [1, 2, 3, 4]}
    b = make_rollout(["long", "er"])
    b.completion_ids, b.completion_mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    b.columns = {"answer": [5, 6]}
    both = a.select(torch.tensor([2, 3])).cat(b, pad_id=9)
    assert both.completions == ["z", "w", "long", "er"] and both.columns == {"answer": [3, 4, 5, 6]}
    assert both.completion_ids.shape == (4, 5) and both.completion_ids[0].tolist() == [1, 1, 9, 9, 9]
    with pytest.raises(ValueError, match="differ in which per-token fields"):
        b.sampling_logps = torch.zeros(2, 5)
        a.cat(b, pad_id=0)
