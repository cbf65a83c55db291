"""Every loss type and option equals TRL 1.16's own ``GRPOTrainer._compute_loss`` in value and gradient.

TRL's method runs on a stub ``self`` holding the options, one process, no gradient accumulation, and a
``_get_per_token_logps_and_entropies`` that returns our leaf tensors, so both sides differentiate the same inputs.
"""

from __future__ import annotations

import dataclasses
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from lightning_grpo.loss import LOSS_TYPES, LossConfig, grpo_loss
from lightning_grpo.loss.entropy import EntropyController

T = 5


def trl_stub(c: LossConfig, logps, entropies, *, use_vllm=False):
    """A stand-in for the trainer whose attributes ``_compute_loss`` reads, set from ``c``."""
    from trl import GRPOTrainer

    args_fields = [f.name for f in dataclasses.fields(c)]
    fake = SimpleNamespace(
        top_entropy_quantile=c.top_entropy_quantile,
        off_policy_mask_threshold=c.off_policy_mask_threshold,
        importance_sampling_level=c.importance_sampling_level,
        beta=c.beta,
        loss_type=c.loss_type,
        epsilon_low=c.epsilon,
        epsilon_high=c.clip_high,
        use_vllm=use_vllm,
        vllm_importance_sampling_correction=use_vllm,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        entropy_coef=c.entropy_coef,
        use_adaptive_entropy=c.use_adaptive_entropy,
        _entropy_bonus_enabled=c.entropy_coef != 0.0 or c.use_adaptive_entropy,
        _last_world_entropy=float("inf"),
        _entropy_window_stats=None,
        aux_loss_enabled=False,
        args=SimpleNamespace(**{k: getattr(c, k) for k in args_fields}, steps_per_generation=1),
        accelerator=SimpleNamespace(
            num_processes=1,
            sync_gradients=True,
            reduce=lambda t, reduction: t,
            gather=lambda t: t,
            gather_for_metrics=lambda t: t,
            pad_across_processes=lambda t, dim, pad_index: t,
        ),
        _metrics={"train": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, entropies, None),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
    )
    fake.get_high_entropy_mask = types.MethodType(GRPOTrainer.get_high_entropy_mask, fake)
    return fake


def trl_loss(c: LossConfig, data: dict, **stub_kw):
    """TRL's loss and the gradients it gives ``logps`` (and ``entropies``), plus the stub for its state."""
    logps = data["logps"].clone().requires_grad_(True)
    entropies = data["entropies"].clone().requires_grad_(True)
    fake = trl_stub(c, logps, entropies, use_vllm=data.get("is_ratio") is not None, **stub_kw)
    loss = trl_compute(fake, data)
    loss.backward()
    return loss.detach(), logps.grad, entropies.grad, fake


def trl_compute(fake, data: dict):
    from trl import GRPOTrainer

    inputs = {
        "prompt_ids": torch.zeros(len(data["adv"]), 1, dtype=torch.long),
        "prompt_mask": torch.ones(len(data["adv"]), 1),
        "completion_ids": torch.zeros_like(data["mask"]),
        "completion_mask": data["mask"],
        "advantages": data["adv"],
        "old_per_token_logps": data["old"],
        "ref_per_token_logps": data["ref"],
        "num_items_in_batch": data["mask"].sum(),
    }
    if data.get("is_ratio") is not None:
        inputs["importance_sampling_ratio"] = data["is_ratio"]
    if data.get("sampling") is not None:
        inputs["sampling_per_token_logps"] = data["sampling"]
    return GRPOTrainer._compute_loss(fake, None, inputs)


def our_loss(c: LossConfig, data: dict, **kw):
    logps = data["logps"].clone().requires_grad_(True)
    entropies = data["entropies"].clone().requires_grad_(True)
    out = grpo_loss(
        logps,
        data["old"],
        data["adv"],
        data["mask"],
        c,
        ref_logps=data["ref"],
        max_completion_length=T,
        sampling_weights=data.get("is_ratio"),
        sampling_logps=data.get("sampling"),
        entropies=entropies,
        **kw,
    )
    out.loss.backward()
    return out.loss.detach(), logps.grad, entropies.grad, out


def make_data(seed=1, n=6, spread=0.3, is_ratio=False, sampling=False):
    gen = torch.Generator().manual_seed(seed)
    logps = torch.randn(n, T, generator=gen) * 0.3 - 1
    mask = (torch.rand(n, T, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    data = {
        "logps": logps,
        "old": logps + torch.randn(n, T, generator=gen) * spread,
        "ref": logps + torch.randn(n, T, generator=gen) * spread,
        "adv": torch.randn(n, generator=gen),
        "mask": mask,
        "entropies": torch.rand(n, T, generator=gen) * 3,
    }
    if is_ratio:  # token-level sampling-correction weights, 1 on padding as TRL computes them
        data["is_ratio"] = torch.where(mask.bool(), torch.rand(n, T, generator=gen) + 0.5, 1.0)
    if sampling:
        data["sampling"] = data["old"] + torch.randn(n, T, generator=gen) * 0.5
    return data


def assert_same(c: LossConfig, data: dict, **kw):
    expected, expected_grad, expected_ent_grad, fake = trl_loss(c, data)
    ours, grad, ent_grad, _ = our_loss(c, data, **kw)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(grad, expected_grad, rtol=1e-5, atol=1e-7), (grad, expected_grad)
    if expected_ent_grad is not None:
        assert torch.allclose(ent_grad, expected_ent_grad, rtol=1e-5, atol=1e-7)
    else:
        assert ent_grad is None or not ent_grad.any()
    assert grad.abs().sum() > 0  # the comparison is not vacuous
    return fake


# the original sixteen cases, now with gradients, and with TRL's use_bias_correction_kl both ways
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta,delta", [(0.0, None), (0.04, 1.5)])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_clipped_losses_equal_trl(loss_type, level, beta, delta, bias_correction):
    c = LossConfig(
        loss_type=loss_type,
        beta=beta,
        epsilon_high=0.28,
        delta=delta,
        importance_sampling_level=level,
        use_bias_correction_kl=bias_correction,
    )
    assert_same(c, make_data())


NEW_TYPES = {
    "cispo": dict(epsilon_high=1.2),  # the cap binds for some tokens at spread 0.3
    "sapo": dict(sapo_temperature_pos=1.3, sapo_temperature_neg=0.7),
    "luspo": dict(epsilon_high=0.28),
    "vespo": dict(vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5),
}


@pytest.mark.parametrize("loss_type", sorted(NEW_TYPES))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_new_loss_types_equal_trl(loss_type, level, beta):
    c = LossConfig(loss_type=loss_type, beta=beta, importance_sampling_level=level, **NEW_TYPES[loss_type])
    assert_same(c, make_data(seed=2))


@pytest.mark.parametrize("loss_type", sorted(LOSS_TYPES))
def test_default_options_equal_trl(loss_type):
    c = LossConfig(loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None)
    assert_same(c, make_data(seed=3, spread=1.0))


@pytest.mark.parametrize("loss_type", sorted(LOSS_TYPES))
def test_sampling_weights_equal_trl_importance_sampling(loss_type):
    # vespo folds the weights into its sequence ratio; every other type multiplies the policy term
    c = LossConfig(loss_type=loss_type, beta=0.04, epsilon_high=5.0 if loss_type == "cispo" else None)
    assert_same(c, make_data(seed=4, is_ratio=True))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo", "sapo", "vespo"])
def test_per_token_advantages_equal_trl(loss_type):
    # REINFORCE++ gives [n, T] advantages; TRL's _compute_loss accepts them too
    data = make_data(seed=8)
    data["adv"] = torch.randn(6, T, generator=torch.Generator().manual_seed(0))
    c = LossConfig(
        loss_type=loss_type, epsilon_high=5.0 if loss_type == "cispo" else None, off_policy_mask_threshold=0.05
    )
    assert_same(c, data)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo", "sapo", "vespo"])
@pytest.mark.parametrize("use_sampler_logps", [False, True])
def test_off_policy_mask_equals_trl(loss_type, use_sampler_logps):
    c = LossConfig(
        loss_type=loss_type, off_policy_mask_threshold=0.1, epsilon_high=5.0 if loss_type == "cispo" else None
    )
    data = make_data(seed=5, spread=0.5, sampling=use_sampler_logps)
    assert_same(c, data)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "luspo", "sapo"])
@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5])
def test_top_entropy_quantile_equals_trl(loss_type, quantile):
    assert_same(LossConfig(loss_type=loss_type, top_entropy_quantile=quantile, beta=0.04), make_data(seed=6))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("quantile", [1.0, 0.3])
def test_entropy_bonus_equals_trl(loss_type, quantile):
    c = LossConfig(loss_type=loss_type, entropy_coef=0.05, top_entropy_quantile=quantile)
    assert_same(c, make_data(seed=7))


def test_adaptive_entropy_controller_follows_trl_step_by_step():
    # six optimiser steps of one micro-batch; entropy falls through the 1.5-nat target, then rises again
    c = LossConfig(use_adaptive_entropy=True, entropy_coef=0.01, entropy_coef_delta=0.02, entropy_target=1.5)
    ours = EntropyController(0.01, adaptive=True, coef_delta=0.02, target=1.5)
    carried = {"entropy_coef": 0.01, "_last_world_entropy": float("inf")}  # TRL's controller state between steps
    applied = []
    for step, scale in enumerate([1.5, 0.5, 0.3, 0.3, 1.5, 1.5]):
        data = make_data(seed=10 + step)
        data["entropies"] = data["entropies"] * scale
        fake = trl_stub(c, None, None)
        logps, ents = data["logps"].clone().requires_grad_(True), data["entropies"].clone().requires_grad_(True)
        fake._get_per_token_logps_and_entropies = lambda *a, lp=logps, e=ents, **k: (lp, e, None)
        vars(fake).update(carried)
        expected = trl_compute(fake, data)
        expected.backward()
        applied.append(ours.coef_to_apply())
        loss, grad, ent_grad, out = our_loss(c, data, entropy_coef=ours.coef_to_apply())
        ours.observe(out.trained_entropy, out.trained_tokens)
        ours.update()
        carried = {"entropy_coef": fake.entropy_coef, "_last_world_entropy": fake._last_world_entropy}
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7), step
        assert torch.allclose(grad, logps.grad, atol=1e-7) and torch.allclose(ent_grad, ents.grad, atol=1e-7), step
        assert (ours.coef, ours.last_entropy) == pytest.approx((fake.entropy_coef, fake._last_world_entropy)), step
    # mean entropies ~2.2, 0.75, 0.45, 0.45, 2.2, 2.2 nats against the 1.5 target. No bonus before the first
    # measurement (step 0) nor after a step above target (1, 5); coef 0.01 -> 0 -> 0.02 -> 0.04 -> 0.06 -> 0.04
    assert applied == pytest.approx([0.0, 0.0, 0.02, 0.04, 0.06, 0.0])
    assert ours.state_dict()["coef"] == pytest.approx(0.02)
