"""NoSignalAlert on real runs of the tiny model: a reward that never fires (0 for every completion), one that always
fires (1) and one that scores the prompt stop the run at the patience, the message naming the cause, a completion
beside its expected answer and what to change; so does a filter_groups run whose filter never finds a group with
signal; a run with signal, and a distillation run, never fire it."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import fit, logged, make_module, run_ranks

from lightning_grpo import PromptDataModule
from lightning_grpo.callbacks import GRPOAlertError, NoSignalAlert
from lightning_grpo.callbacks.no_signal import cause
from lightning_grpo.run import run_dir
from lightning_grpo.types import RewardScores


def data(path):
    return PromptDataModule(path, batch_size=4, val_split=None)


def zero_reward(completions, **kwargs):
    """Never fires: an exact match on a model that answers in sentences."""
    return [0.0] * len(completions)


def full_reward(completions, **kwargs):
    """Always fires."""
    return [1.0] * len(completions)


def first_digit_reward(prompts, completions, **kwargs):
    """Scores the prompt, not the completion: every group alike within, the groups apart."""
    return [float(p[0]) for p in prompts]


def run(model_dir, path, tmp_path, reward, alert, **settings):
    module = make_module(model_dir, reward_funcs=[reward], accuracy_reward=None, **settings)
    return fit(module, data(path), tmp_path, max_steps=30, callbacks=[alert])


def test_a_reward_that_never_fires_stops_the_run_at_the_patience(tiny_model_dir, arith_jsonl, tmp_path):
    alert = NoSignalAlert(patience=3)  # the default action: stop
    trainer = run(tiny_model_dir, arith_jsonl, tmp_path, zero_reward, alert)
    assert trainer.global_step == 3 and [f.signal for f in alert.firings] == ["no_learning_signal"]
    message = alert.firings[0].message
    assert "NoSignalAlert at step 3: no_learning_signal" in message and "for 3 consecutive steps" in message
    assert "NO LEARNING SIGNAL" in message
    assert "the reward never fires: every completion scored 0 (zero_reward 0 for every completion)" in message
    a, b, answer = re.search(r"prompt '(\d)\+(\d)=' -> completion '.*', expected \(answer column\): '(\d+)'", message,
                             re.DOTALL).groups()  # fmt: skip
    assert int(a) + int(b) == int(answer)  # the sample's own row's answer
    assert "lightning_grpo.rewards.math_verify_reward or lightning_grpo.rewards.numeric_match_reward" in message
    assert "partial_format_reward" in message and "model.num_generations" in message and "temperature" in message
    written = [json.loads(line) for line in (run_dir(trainer) / "alerts.jsonl").read_text().splitlines()]
    assert [w["alert"] for w in written] == ["NoSignalAlert"] and written[0]["message"] == message
    assert logged(trainer)["train/alerts/no_learning_signal"] == [0.0, 0.0, 1.0]
    last = torch.load(run_dir(trainer) / "checkpoints/last.ckpt", weights_only=False)
    assert last["global_step"] == 3  # the stopped run's checkpoint, to resume after a fix


def test_a_reward_that_always_fires_is_named_so(tiny_model_dir, arith_jsonl, tmp_path):
    alert = NoSignalAlert(patience=2)
    trainer = run(tiny_model_dir, arith_jsonl, tmp_path, full_reward, alert)
    assert trainer.global_step == 2
    message = alert.firings[0].message
    assert "the reward always fires: every completion scored 1 (full_reward 1 for every completion)" in message
    assert "the task is solved for this data" in message and "expected (answer column)" in message


def test_a_reward_of_the_prompt_is_named_so(tiny_model_dir, arith_jsonl, tmp_path):
    alert = NoSignalAlert(patience=2, action="raise")
    with pytest.raises(GRPOAlertError, match="the reward scores the prompt, not the completion") as raised:
        run(tiny_model_dir, arith_jsonl, tmp_path, first_digit_reward, alert)
    assert "check that the reward reads the completion" in str(raised.value)


def test_filter_groups_that_never_find_a_group_with_signal_stop_too(tiny_model_dir, arith_jsonl, tmp_path):
    """Every group is dropped and no update is ever made: with max_num_gen_batches 0 (no limit) the run would draw
    batches for ever (max_epochs bounds it here); the alert counts the generation batches and stops it."""
    alert = NoSignalAlert(patience=3)
    filtering = {"filter_groups": True, "max_num_gen_batches": 0}
    module = make_module(tiny_model_dir, reward_funcs=[zero_reward], accuracy_reward=None, advantages=filtering)
    trainer = fit(module, data(arith_jsonl), tmp_path, max_steps=5, max_epochs=3, callbacks=[alert])
    assert trainer.global_step == 0 and trainer.fit_loop.epoch_loop.batch_progress.total.completed == 3
    message = alert.firings[0].message
    assert "filter_groups dropped every group of these generation batches, no update made" in message
    assert "the reward never fires" in message and "expected (answer column)" in message
    assert (run_dir(trainer) / "checkpoints/last.ckpt").exists()


def test_a_run_with_signal_never_fires_it(tiny_model_dir, arith_jsonl, tmp_path):
    alert = NoSignalAlert(patience=1, action="raise")
    trainer = fit(make_module(tiny_model_dir), data(arith_jsonl), tmp_path, max_steps=4, callbacks=[alert])
    assert trainer.global_step == 4 and not alert.firings and not alert.counts  # length_reward differs in groups


def test_a_distillation_run_learns_from_its_teacher_whatever_the_rewards(tiny_model_dir, arith_jsonl, tmp_path):
    alert = NoSignalAlert(patience=1, action="raise")
    settings = {"distill": {"teacher": tiny_model_dir, "reward_weight": 0.0}}
    trainer = run(tiny_model_dir, arith_jsonl, tmp_path, zero_reward, alert, **settings)
    assert trainer.global_step == 30 and not alert.firings


@pytest.mark.parametrize(
    ("totals", "expected"),
    [
        ([0.0, 0.0, 0.0, 0.0], ("never", {"value": 0.0})),
        ([-1.0, -1.0, -1.0, -1.0], ("never", {"value": -1.0})),
        ([1.0, 1.0, 1.0, 1.0], ("always", {"value": 1.0})),
        ([0.0, 0.0, 2.0, 2.0], ("prompt", {"low": 0.0, "high": 2.0})),
        ([float("nan")] * 4, ("unscored", {})),
    ],
)
def test_the_cause_from_the_rewards(totals, expected):
    scores = RewardScores(torch.tensor(totals).unsqueeze(1), ["f"], torch.tensor([1.0]))
    assert cause(scores) == expected


def test_the_docstring_example_runs():
    example = re.search(r"Example::\n\n(.*)", NoSignalAlert.__doc__, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile("\n".join(line[8:] for line in example.splitlines()), "Example", "exec"), scope)
    (alert,) = [c for c in scope["trainer"].callbacks if isinstance(c, NoSignalAlert)]
    assert (alert.patience, alert.action) == (10, "stop")


@pytest.mark.slow
@pytest.mark.parametrize("filtering", ["0", "1"])
def test_two_ranks_decide_on_every_rank_s_groups(tiny_model_dir, arith_jsonl, tmp_path, filtering):
    """Rank 0's groups never differ, rank 1's do for 3 batches: no firing while rank 1 has signal, then both ranks
    fire and stop at the same batch, patience 2 later (with filter_groups no update is ever made: rank 0 has none)."""
    ranks = run_ranks("no_signal_ddp_run.py", [tiny_model_dir, arith_jsonl, str(tmp_path), filtering], tmp_path)
    assert ranks[0]["batches"] == ranks[1]["batches"] == 3 + 2
    steps = 0 if filtering == "1" else 5
    assert [r["global_step"] for r in ranks] == [steps, steps]
    assert [len(r["firings"]) for r in ranks] == [1, 1] and all(r["firings"][0][0] == steps for r in ranks)
    assert "the reward never fires: every completion scored 0" in ranks[0]["firings"][0][1]
