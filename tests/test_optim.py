"""Weight decay applies to weight matrices only, on a tiny Qwen2 and on a LoRA-wrapped one."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_grpo.optim import decay_parameter_names, param_groups


def tiny_qwen2(tie=True):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(config)


def names_in(groups, model):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [sorted(by_id[id(p)] for p in g["params"]) for g in groups]


def test_qwen2_decays_matrices_only():
    model = tiny_qwen2()
    groups = param_groups(model, 0.1)
    decayed, kept = names_in(groups, model)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    # Qwen2's q/k/v projections have biases; its norms are RMSNorm (no nn.LayerNorm); the head is tied
    assert "model.layers.0.self_attn.q_proj.weight" in decayed and "model.layers.0.mlp.down_proj.weight" in decayed
    assert "model.layers.0.self_attn.q_proj.bias" in kept
    assert {"model.norm.weight", "model.layers.0.input_layernorm.weight"} <= set(kept)
    assert "model.embed_tokens.weight" in kept  # and with it the tied lm_head
    assert not any("bias" in n or "norm" in n or "embed" in n for n in decayed)
    assert len(decayed) + len(kept) == len(list(model.parameters()))  # every parameter once


def test_untied_head_decays_and_embeddings_can_opt_in():
    model = tiny_qwen2(tie=False)
    assert "lm_head.weight" in decay_parameter_names(model)
    assert "model.embed_tokens.weight" not in decay_parameter_names(model)
    assert "model.embed_tokens.weight" in decay_parameter_names(model, decay_embeddings=True)


def test_lora_groups_hold_only_trainable_adapter_weights():
    model = get_peft_model(tiny_qwen2(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    groups = param_groups(model, 0.1)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1  # adapters are matrices; the frozen base is out
    names = names_in(groups, model)[0]
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    assert len(names) == sum(p.requires_grad for p in model.parameters())


def test_adamw_leaves_norm_weights_alone():
    # zero gradient, lr 1: decayed weights shrink by lr * wd, norm gains stay exactly 1
    model = tiny_qwen2()
    optimizer = torch.optim.AdamW(param_groups(model, 0.5), lr=1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    optimizer.step()
    assert (model.model.norm.weight == 1.0).all()
    assert torch.allclose(model.model.layers[0].mlp.down_proj.weight, before * 0.5)
