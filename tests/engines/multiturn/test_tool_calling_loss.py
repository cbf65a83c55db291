"""The loss of a multi-turn rollout: with ``tool_mask``, ours (mask = completion_mask * tool_mask) equals TRL 1.16's
``_compute_loss`` given ``tool_mask`` in its inputs, in value and gradient; tool-result tokens get no gradient, and
completions without a tool call get the single-turn gradient."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.loss import LossConfig, grpo_loss
from tests.loss.test_grpo_trl import T, make_data, trl_stub


def with_tool_mask(data: dict, seed: int = 3) -> dict:
    """Rows 0-3 had a tool call: a stretch of their tokens is a tool reply; rows 4-5 are single-turn."""
    gen = torch.Generator().manual_seed(seed)
    tool = torch.ones_like(data["mask"])
    for row in range(4):
        start = int(torch.randint(1, T - 1, (1,), generator=gen))
        tool[row, start : start + 2] = 0
    return {**data, "tool": tool}


def trl_tool_loss(c: LossConfig, data: dict):
    from trl import GRPOTrainer

    logps = data["logps"].clone().requires_grad_(True)
    entropies = data["entropies"].clone().requires_grad_(True)
    fake = trl_stub(c, logps, entropies)
    n = len(data["adv"])
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1),
        "completion_ids": torch.zeros_like(data["mask"]),
        "completion_mask": data["mask"],
        "tool_mask": data["tool"],
        "advantages": data["adv"],
        "old_per_token_logps": data["old"],
        "ref_per_token_logps": data["ref"],
        "num_items_in_batch": (data["mask"] * data["tool"]).sum(),  # TRL counts the model's tokens only
    }
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    loss.backward()
    return loss.detach(), logps.grad


def our_tool_loss(c: LossConfig, data: dict, mask: torch.Tensor):
    logps = data["logps"].clone().requires_grad_(True)
    out = grpo_loss(logps, data["old"], data["adv"], mask, c, ref_logps=data["ref"], max_completion_length=T)
    out.loss.backward()
    return out.loss.detach(), logps.grad


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_tool_masked_loss_equals_trl(loss_type, level, beta):
    c = LossConfig(loss_type=loss_type, beta=beta, epsilon_high=0.28, importance_sampling_level=level)
    data = with_tool_mask(make_data())
    expected, expected_grad = trl_tool_loss(c, data)
    ours, grad = our_tool_loss(c, data, data["mask"] * data["tool"])
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad.abs().sum() > 0
    assert not grad[data["tool"] == 0].any()  # no gradient on any tool-reply token


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rows_without_a_call_get_the_single_turn_gradient(level):
    # grpo averages per completion, so a row's gradient depends only on its own tokens
    c = LossConfig(loss_type="grpo", importance_sampling_level=level)
    data = with_tool_mask(make_data())
    _, multi = our_tool_loss(c, data, data["mask"] * data["tool"])
    _, single = our_tool_loss(c, data, data["mask"])
    torch.testing.assert_close(multi[4:], single[4:], rtol=0, atol=0)
    assert not torch.allclose(multi[:4], single[:4])
    # and with no call anywhere, the multi-turn mask is the single-turn one for every loss type
    for loss_type in ("dapo", "bnpo", "dr_grpo"):
        c = LossConfig(loss_type=loss_type, importance_sampling_level=level)
        ones = {**data, "tool": torch.ones_like(data["mask"])}
        torch.testing.assert_close(trl_tool_loss(c, ones)[1], our_tool_loss(c, data, data["mask"])[1])
