"""The MoE router auxiliary loss equals the model's own and is weighted as TRL 1.16 weights it."""

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2Config

from lightning_grpo.model.logprobs import completion_logps, position_ids_from_mask, router_aux_coef


def tiny_mixtral():
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
    )
    return MixtralForCausalLM(config)


def test_aux_loss_equals_the_models_own_forward_with_gradient():
    model = tiny_mixtral()
    ids = torch.randint(0, 64, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding is left out of the expert counts
    ours = completion_logps(model, ids, mask, 4, router_aux=True).aux_loss
    ours.backward()
    ours_grad = model.model.layers[0].mlp.gate.weight.grad.clone()
    model.zero_grad()
    expected = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), output_router_logits=True
    ).aux_loss
    expected.backward()
    assert ours.item() == pytest.approx(expected.item(), rel=1e-6) and ours.item() > 0
    assert torch.allclose(ours_grad, model.model.layers[0].mlp.gate.weight.grad, atol=1e-7)
    assert completion_logps(model, ids, mask, 4).aux_loss is None  # off unless asked


def test_coefficient_resolves_as_trl():
    moe = tiny_mixtral().config
    assert router_aux_coef(moe) == 0.02  # the config's own
    assert router_aux_coef(moe, 0.1) == 0.1 and router_aux_coef(moe, 0.0) == 0.0
    assert router_aux_coef(Qwen2Config()) == 0.0  # dense: nothing to weight
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.1 needs a Mixture-of-Experts model.*Qwen2Config"):
        router_aux_coef(Qwen2Config(), 0.1)
