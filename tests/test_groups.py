"""dynamic.py: DAPO's dynamic sampling (filter_groups), alone and in a real fit."""

import lightning as L
import pytest
import torch
from helpers import fit, logged, make_module, make_rollout

from lightning_grpo import PromptDataModule
from lightning_grpo.groups import GroupBuffer, select_groups
from lightning_grpo.types import RewardScores, drawn_batch, step_record


def data(path, batch_size=4):
    return PromptDataModule(path, batch_size=batch_size, val_split=None)


def scores_of(totals):
    return RewardScores(torch.tensor(totals).unsqueeze(1), ["r"], torch.ones(1))


def test_groups_with_equal_rewards_are_dropped_and_batches_concatenate():
    a = make_rollout(["x", "y", "z", "z"])  # groups: (x, y) and (z, z)
    flat = scores_of([1.0, 0.0, 1.0, 1.0])
    kept, scores = select_groups(a, flat, ~flat.groups_without_signal(2))
    assert kept.completions == ["x", "y"] and scores.per_function.squeeze(1).tolist() == [1.0, 0.0]
    b = make_rollout(["long", "er"])
    b.completion_ids, b.completion_mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    both = kept.cat(b, pad_id=9)
    assert both.completion_ids.shape == (4, 5) and both.completion_mask[:2].sum().item() == 4  # right-padded
    assert both.completions == ["x", "y", "long", "er"]


def test_group_buffer_fills_across_generation_batches():
    buffer = GroupBuffer(pad_id=0)
    buffer.add(make_rollout(["a", "a", "b", "c"]), scores_of([1.0, 1.0, 0.0, 1.0]))
    assert buffer.num_groups == 1
    buffer.add(make_rollout(["d", "e", "f", "f"]), scores_of([0.0, 1.0, 1.0, 1.0]))
    rollout, scores, metrics = buffer.take(2)
    assert rollout.completions == ["b", "c", "d", "e"] and buffer.num_groups == 0
    assert metrics == {
        "filter_groups/num_gen_batches": 2.0,
        "filter_groups/kept_fraction": 0.5,
        "filter_groups/carried_groups": 0.0,
        "filter_groups/dropped_groups": 0.0,
    }


def test_surplus_groups_within_the_staleness_bound_wait_for_the_next_update():
    """An engine sampling ahead with max_staleness 1: the oldest groups train first; of the surplus, groups
    sampled by the current weights (0 updates behind) are carried, one update behind would be 2 at the next: dropped."""
    buffer = GroupBuffer(pad_id=0, max_staleness=1)
    buffer.add(make_rollout(["a", "b", "c", "d"]), scores_of([1.0, 0.0, 1.0, 0.0]))  # 2 groups, 1 behind
    buffer.add(make_rollout(["e", "f", "g", "h"]), scores_of([1.0, 0.0, 0.0, 1.0]))  # 2 groups, current
    behind = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0])
    rollout, _, metrics = buffer.take(1, staleness=behind)
    assert rollout.completions == ["a", "b"]
    assert metrics["filter_groups/carried_groups"] == 2.0 and metrics["filter_groups/dropped_groups"] == 1.0
    assert buffer.rollout.completions == ["e", "f", "g", "h"] and buffer.num_gen_batches == 0
    buffer.add(make_rollout(["i", "i"]), scores_of([1.0, 1.0]))  # no signal: the carried groups make the update
    rollout, _, metrics = buffer.take(2, staleness=torch.tensor([1, 1, 1, 1]))
    assert rollout.completions == ["e", "f", "g", "h"] and metrics["filter_groups/kept_fraction"] == 0.0
    restored = GroupBuffer(pad_id=0, max_staleness=1)
    buffer.add(make_rollout(["j", "k"]), scores_of([1.0, 0.0]))
    restored.load_state_dict(buffer.state_dict())  # a checkpoint keeps the groups waiting and the counters
    assert restored.rollout.completions == ["j", "k"] and restored.num_gen_batches == 1 and restored.groups_kept == 1


def test_an_in_process_engine_drops_the_surplus_as_verl_does():
    buffer = GroupBuffer(pad_id=0, max_staleness=1)
    buffer.add(make_rollout(["a", "b", "c", "d"]), scores_of([1.0, 0.0, 1.0, 0.0]))
    _, _, metrics = buffer.take(1, staleness=None)  # sampled by the weights this update changes: nothing corrects it
    assert metrics["filter_groups/dropped_groups"] == 1.0 and buffer.rollout is None


def signal_on_even_sums(prompts, completions, **kwargs):
    """Differing rewards only for prompts whose two digits add to an even number: the others are flat."""
    return [len(c) / 8 if (int(p[0]) + int(p[2])) % 2 == 0 else 1.0 for p, c in zip(prompts, completions)]


def test_filter_groups_updates_only_on_groups_with_signal(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(
        tiny_model_dir,
        reward_funcs=[signal_on_even_sums],
        accuracy_reward=None,
        advantages={"filter_groups": True},
    )
    records, drawn = [], []

    class Keep(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            records.append(step_record(outputs))
            drawn.append(drawn_batch(outputs))

    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=2, callbacks=[Keep()])
    trained = [r for r in records if r is not None]
    assert trainer.global_step == 2 and len(records) > 2  # some batches only filled the buffer
    for record in trained:
        assert len(record.rollout) == 4 * 4  # a full batch of 4 groups
        assert record.stats.rewards.frac_zero_std == 0.0
        assert all((int(p[0]) + int(p[2])) % 2 == 0 for p in record.rollout.prompts)
    assert logged(trainer)["train/filter_groups/kept_fraction"][0] < 1.0
    waited = [d for d in drawn if d is not None]  # the batches that only filled the buffer, published as drawn
    assert len(waited) == len(records) - len(trained) and all(len(d.rollout) == 4 * 4 for d in waited)
    for d in waited:  # their groups with signal (one rank: every rank's), of an even sum only
        assert d.groups_with_signal == int((~d.scores.groups_without_signal(4)).sum()) < 4
        assert d.groups_with_signal <= sum((int(p[0]) + int(p[2])) % 2 == 0 for p in d.rollout.prompts[::4])


def test_filter_groups_gives_up_after_max_num_gen_batches(tiny_model_dir, arith_jsonl, tmp_path):
    flat = lambda prompts, completions, **kw: [1.0] * len(completions)  # noqa: E731
    module = make_module(
        tiny_model_dir,
        reward_funcs=[flat],
        accuracy_reward=None,
        advantages={"filter_groups": True, "max_num_gen_batches": 2},
    )
    with pytest.warns(UserWarning, match="max_num_gen_batches.*gave no group with differing rewards"):
        trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=1, max_epochs=1)
    assert trainer.global_step == 0  # no signal, no update: nothing was trained on flat rewards
