"""FusedDecodeStep against the model's own forward, per architecture: the same next-token logits to fp32 rounding
over several decode steps with left padding, also after rows are dropped (``select``); greedy LeanDecode equals
``generate`` through it; and the models it must not take (LoRA-wrapped layers, a sliding window, bf16) run their
forward."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from lightning_grpo.engines import HFGenerate, LeanDecode
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode.fused import fusable
from lightning_grpo.engines.decode.lean import NextTokenLogits, decode_weights
from lightning_grpo.model.policy import Policy

SIZES = dict(
    vocab_size=300,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)  # fmt: skip   wide enough that the fused weights are packed (>= 64k elements)
CONFIGS = {
    "qwen2": lambda: Qwen2Config(**SIZES),  # biases on q, k and v
    "llama": lambda: LlamaConfig(**SIZES, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=64),  # RMSNorm on each head's q and k
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
}


def model_of(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name]()).eval()
    for p in model.parameters():  # random biases and norm weights: a zero bias or unit weight hides a mistake
        if p.dim() == 1:
            p.data.normal_(1.0 if p.data.eq(1).all() else 0.0, 0.1)
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_step_gives_the_forwards_logits(name):
    model = model_of(name)
    assert fusable(model)
    n, width, steps = 4, 7, 5
    ids = torch.randint(3, 300, (n, width))
    mask = torch.ones(n, width, dtype=torch.long)
    mask[0, :3], mask[1, :1] = 0, 0  # left padding
    positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    plain, cache = NextTokenLogits(model), DynamicCache(config=model.config)
    with torch.no_grad(), decode_weights(model, n) as fused:
        plain(ids, mask, positions, cache)
        fused_cache = DynamicCache(config=model.config)
        plain(ids, mask, positions, fused_cache)
        fused.bind(fused_cache, width + steps)
        position = mask.sum(1, keepdim=True)
        for step in range(steps):
            token = torch.randint(3, 300, (n, 1))
            mask = torch.cat([mask, torch.ones(n, 1, dtype=torch.long)], dim=1)
            expected = plain(token, mask, position + step, cache)
            torch.testing.assert_close(fused(token, mask, position + step, None), expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_step_after_select_gives_the_forwards_logits(name):
    """Rows 0, 2 and 3 of 4 kept after two steps (the cache narrowed by ``batch_select_indices``, the fused buffers
    by ``select``): three more steps give the forward's logits for those rows."""
    model = model_of(name)
    n, width, steps, kept = 4, 7, 5, torch.tensor([0, 2, 3])
    ids = torch.randint(3, 300, (n, width))
    mask = torch.ones(n, width, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    position = mask.sum(1, keepdim=True)
    plain, cache, fused_cache = (
        NextTokenLogits(model),
        DynamicCache(config=model.config),
        DynamicCache(config=model.config),
    )
    with torch.no_grad(), decode_weights(model, n) as fused:
        plain(ids, mask, positions, cache)
        plain(ids, mask, positions, fused_cache)
        fused.bind(fused_cache, width + steps)
        for step in range(steps):
            if step == 2:
                mask, position = mask[kept], position[kept]
                cache.batch_select_indices(kept)
                fused.select(kept, width + step)  # the prefill's columns and two decoded ones
            token = torch.randint(3, 300, (len(mask), 1))
            mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=torch.long)], dim=1)
            expected = plain(token, mask, position + step, cache)  # [n, V]
            torch.testing.assert_close(fused(token, mask, position + step, None), expected, rtol=0, atol=2e-5)
    assert len(expected) == 3


def test_greedy_lean_decode_through_the_fused_step_equals_generate(tiny_model_dir):
    policy = Policy(tiny_model_dir)  # the demo's Qwen2, loaded as a user's model is
    assert fusable(policy.model)
    prompts = ["max(1,2,3)=", "max(9,2,3)= and a longer one", "a"]  # left padding
    sampling = SamplingConfig(max_completion_length=12)
    fused = LeanDecode().generate(policy, prompts, 2, sampling, greedy=True)
    unfused = LeanDecode(fused_layers=False).generate(policy, prompts, 2, sampling, greedy=True)
    expected = HFGenerate().generate(policy, prompts, 2, sampling, greedy=True).completion_ids
    assert torch.equal(fused.completion_ids, unfused.completion_ids)
    assert torch.equal(fused.completion_ids, expected)


def test_models_the_fused_step_does_not_take_run_their_forward():
    lora = get_peft_model(model_of("qwen2"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert not fusable(lora)
    windowed = AutoModelForCausalLM.from_config(MistralConfig(**SIZES, sliding_window=16))
    assert not fusable(windowed)
    assert not fusable(model_of("llama").to(torch.bfloat16))
    assert not fusable(AutoModelForCausalLM.from_config(GPT2Config(vocab_size=300, n_embd=64, n_layer=1, n_head=2)))
