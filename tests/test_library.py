"""Where a library has it, we use it: TRL's nanstd, every schedule of transformers.get_scheduler, torchmetrics'
ROUGE-L; and where we keep our own, a test that it equals the library's."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.functional.text.rouge import rouge_score
from transformers import SchedulerType, get_scheduler
from trl.trainer.utils import nanstd as trl_nanstd

from lightning_grpo import GRPOModule
from lightning_grpo.advantages import nanstd
from lightning_grpo.optim import scheduler
from lightning_grpo.rewards import exact_match_reward, rouge_l_reward
from lightning_grpo.settings import LR_SCHEDULERS, NEEDS_MORE

NAN = float("nan")


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_nanstd_is_trls(dim):
    x = torch.tensor([[1.0, 2.0, NAN, 4.0], [NAN, NAN, NAN, 1.0], [0.5, 0.5, 0.5, 0.5]])
    torch.testing.assert_close(nanstd(x, dim=dim), trl_nanstd(x, dim=dim), equal_nan=True)


def test_every_get_scheduler_schedule_that_needs_no_more_settings_is_offered():
    assert {"cosine_with_restarts", "polynomial", "inverse_sqrt"} <= set(LR_SCHEDULERS)  # beyond the first four
    assert set(LR_SCHEDULERS) | set(NEEDS_MORE) == {s.value for s in SchedulerType}
    for name in LR_SCHEDULERS:
        ours_opt, theirs_opt = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0) for _ in range(2))
        ours = scheduler(ours_opt, name, warmup_ratio=0.2, steps=10)
        theirs = get_scheduler(name, theirs_opt, num_warmup_steps=2, num_training_steps=10)
        for _ in range(10):
            ours_opt.step(), theirs_opt.step(), ours.step(), theirs.step()
            assert ours_opt.param_groups[0]["lr"] == theirs_opt.param_groups[0]["lr"], name


def test_a_schedule_that_needs_more_settings_is_refused_before_loading(tiny_model_dir):
    with pytest.raises(ValueError, match=r"lr_scheduler_type 'warmup_stable_decay' needs num_decay_steps .*one of"):
        GRPOModule(tiny_model_dir, reward_funcs=[exact_match_reward], lr_scheduler_type="warmup_stable_decay")
    with pytest.raises(ValueError, match=r"lr_scheduler_type must be one of \[.*'polynomial'.*\], got 'cosinus'"):
        GRPOModule(tiny_model_dir, reward_funcs=[exact_match_reward], lr_scheduler_type="cosinus")


def test_rouge_l_is_torchmetrics_and_keeps_non_ascii_words():
    pairs = [("the cat sat on the mat", "a cat sat on a mat"), ("Paris is the capital", "the capital is Paris")]
    for guess, gold in pairs:  # ASCII: torchmetrics' own normaliser gives the same
        expected = round(rouge_score(guess, gold, rouge_keys="rougeL")["rougeL_fmeasure"].item(), 4)
        assert rouge_l_reward([guess], answer=[gold]) == [expected]
    # 4 words shared in order of 5 and 4: P = 4/5, R = 1, F1 = 8/9; torchmetrics' default tokenizer drops "é"
    assert rouge_l_reward(["Le café est très bon"], answer=["le café est bon"]) == [0.8889]
