"""Log-probs equal the model's own forward for every family whose forward transforms the LM head's logits."""

import pytest
import torch
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lightning_grpo.model.logprobs import completion_logps, logit_scale

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

FAMILIES = {
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**TINY)),
    "granite": lambda: GraniteForCausalLM(GraniteConfig(**TINY, logits_scaling=4.0)),  # logits / 4
    "cohere": lambda: CohereForCausalLM(CohereConfig(**TINY, logit_scale=3.0)),  # logits * 3
    "gemma2": lambda: Gemma2ForCausalLM(
        Gemma2Config(**TINY, head_dim=8, final_logit_softcapping=2.0, attn_logit_softcapping=None)
    ),
}


def forward_logps(model, ids, temperature):
    """Reference: log_softmax of the model's own forward logits over the sampling temperature."""
    logits = model(input_ids=ids).logits[:, :-1].float() / temperature  # [n, L-1, vocab]
    return logits.log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logps_equal_the_models_own_forward(family, temperature):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    with torch.no_grad():  # random init leaves the head's logits tiny: make them matter
        model.get_output_embeddings().weight.mul_(20.0)
    ids = torch.randint(0, 97, (3, 9))
    expected = forward_logps(model, ids, temperature)[:, -5:]  # [3, 5] the last 5 tokens are the completion
    got = completion_logps(model, ids, torch.ones_like(ids), 5, temperature=temperature, chunk_size=4)
    assert torch.allclose(got.logps, expected, atol=1e-5), (got.logps - expected).abs().max()


def test_scaled_head_gradient_equals_the_forward():
    # the fused path folds the scale into the temperature: its gradient must follow
    torch.manual_seed(0)
    model = FAMILIES["granite"]()
    ids = torch.randint(0, 97, (2, 6))
    completion_logps(model, ids, torch.ones_like(ids), 3).logps.sum().backward()
    ours = model.lm_head.weight.grad.clone()
    model.zero_grad()
    forward_logps(model, ids, 1.0)[:, -3:].sum().backward()
    assert torch.allclose(ours, model.lm_head.weight.grad, atol=1e-5)


def test_logit_scale_reads_each_family_as_trl_does():
    assert logit_scale(GraniteConfig(logits_scaling=8.0)) == 1 / 8
    assert logit_scale(CohereConfig(logit_scale=0.0625)) == 0.0625
    assert logit_scale(Qwen2Config()) == 1.0
    assert logit_scale(None) == 1.0


@pytest.mark.parametrize("family", ["qwen2", "cohere", "gemma2"])  # fused head, fused + scale, checkpointed head
def test_entropy_gradient_equals_the_forward(family):
    # the entropy bonus needs d H / d theta: loss = sum(logp) - 0.3 sum(H), both ways
    torch.manual_seed(0)
    model = FAMILIES[family]()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    ids = torch.randint(0, 97, (2, 7))
    got = completion_logps(model, ids, torch.ones_like(ids), 4, temperature=0.8, chunk_size=3, entropy_grad=True)
    (got.logps.sum() - 0.3 * got.entropy.sum()).backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logp_all = (model(input_ids=ids).logits[:, -5:-1].float() / 0.8).log_softmax(-1)  # [2, 4, vocab]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    (logp_all.gather(-1, ids[:, -4:].unsqueeze(-1)).sum() - 0.3 * entropy.sum()).backward()
    assert torch.allclose(got.entropy, entropy, atol=1e-5)
    for mine, reference in zip(ours, (p.grad for p in model.parameters())):
        assert torch.allclose(mine, reference, atol=1e-5)


def test_entropy_is_detached_by_default():
    model = FAMILIES["qwen2"]()
    ids = torch.randint(0, 97, (2, 5))
    assert not completion_logps(model, ids, torch.ones_like(ids), 3).entropy.requires_grad
