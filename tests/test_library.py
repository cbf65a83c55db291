"""Where a library has it, we use it: TRL's nanstd, every schedule of transformers.get_scheduler, torchmetrics'
ROUGE-L; and where we keep our own, a test that it equals the library's."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.functional.text.rouge import rouge_score
from transformers import SchedulerType, get_scheduler
from trl.trainer.utils import nanstd as trl_nanstd

from lightning_grpo.optim import LR_SCHEDULERS, OptimConfig, scheduler
from lightning_grpo.rewards import rouge_l_reward
from lightning_grpo.types import nanstd

NAN = float("nan")


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_nanstd_is_trls(dim):
    x = torch.tensor([[1.0, 2.0, NAN, 4.0], [NAN, NAN, NAN, 1.0], [0.5, 0.5, 0.5, 0.5]])
    torch.testing.assert_close(nanstd(x, dim=dim), trl_nanstd(x, dim=dim), equal_nan=True)


KWARGS = {"cosine_with_min_lr": {"min_lr_rate": 0.1}, "cosine_warmup_with_min_lr": {"min_lr_rate": 0.1},
          "warmup_stable_decay": {"num_decay_steps": 3}}  # fmt: skip


def test_every_get_scheduler_schedule_is_offered_and_is_transformers_own():
    # all but the two that step on a monitored metric
    assert set(LR_SCHEDULERS) | {"reduce_lr_on_plateau", "greedy"} == {s.value for s in SchedulerType}
    for name in LR_SCHEDULERS:
        ours_opt, theirs_opt = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0) for _ in range(2))
        config = OptimConfig(lr_scheduler_type=name, warmup_ratio=0.2, lr_scheduler_kwargs=KWARGS.get(name))
        ours = scheduler(ours_opt, config, steps=10)
        theirs = get_scheduler(name, theirs_opt, 2, 10, scheduler_specific_kwargs=KWARGS.get(name))
        for _ in range(10):
            ours_opt.step(), theirs_opt.step(), ours.step(), theirs.step()
            assert ours_opt.param_groups[0]["lr"] == theirs_opt.param_groups[0]["lr"], name


def test_a_schedule_on_a_metric_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"optim.lr_scheduler_type must be one of \[.*'polynomial'.*\], got 'greedy'"):
        OptimConfig(lr_scheduler_type="greedy")


def test_rouge_l_is_torchmetrics_and_keeps_non_ascii_words():
    pairs = [("the cat sat on the mat", "a cat sat on a mat"), ("Paris is the capital", "the capital is Paris")]
    for guess, gold in pairs:  # ASCII: torchmetrics' own normaliser gives the same
        expected = round(rouge_score(guess, gold, rouge_keys="rougeL")["rougeL_fmeasure"].item(), 4)
        assert rouge_l_reward([guess], answer=[gold]) == [expected]
    # 4 words shared in order of 5 and 4: P = 4/5, R = 1, F1 = 8/9; torchmetrics' default tokenizer drops "é"
    assert rouge_l_reward(["Le café est très bon"], answer=["le café est bon"]) == [0.8889]
