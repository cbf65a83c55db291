"""``policy.padding_free`` across the model families the docs list: each tiny decoder (a config built in code), its
packed log-probs against its padded forward's. A family that keeps packed rows apart packs them exactly; one that
does not (OPT, BLOOM, MPT: packed rows attend to each other) is refused when the policy is built, naming the
setting and the model type."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.logprobs import completion_logps
from lightning_grpo.model.padding import PACKED_ROWS_APART
from lightning_grpo.model.policy import Policy

SMALL = {"vocab_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GQA = {**SMALL, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 2}
MOE = {"moe_intermediate_size": 32, "num_experts": 2, "num_experts_per_tok": 1}
FAMILIES = {  # model type -> its tiny config
    "qwen2": lambda: T.Qwen2Config(**GQA),
    "llama": lambda: T.LlamaConfig(**GQA),
    "mistral": lambda: T.MistralConfig(**GQA),
    "phi": lambda: T.PhiConfig(**GQA),
    "gpt2": lambda: T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "gpt_neox": lambda: T.GPTNeoXConfig(**GQA),
    "falcon": lambda: T.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    "gemma": lambda: T.GemmaConfig(**GQA, head_dim=8),
    "phi3": lambda: T.Phi3Config(**GQA, pad_token_id=0),
    "qwen3": lambda: T.Qwen3Config(**GQA, head_dim=8),
    "gemma2": lambda: T.Gemma2Config(**GQA, head_dim=8),
    "mixtral": lambda: T.MixtralConfig(**GQA, num_local_experts=2, num_experts_per_tok=1),
    "qwen2_moe": lambda: T.Qwen2MoeConfig(**GQA, **MOE, shared_expert_intermediate_size=32),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**GQA, **MOE, head_dim=8),
    "opt": lambda: T.OPTConfig(**SMALL, hidden_size=32, ffn_dim=64, word_embed_proj_dim=32),
    "bloom": lambda: T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4),
    "mpt": lambda: T.MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2),
}


def tiny(model_type: str) -> torch.nn.Module:
    config = FAMILIES[model_type]()
    try:
        return T.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    except ValueError:  # BLOOM, MPT and Gemma 2 have eager attention only
        return T.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 12 columns: left-padded prompts of 8, 11 and 12 tokens, completions of 5, 5 and 3."""
    ids = torch.randint(3, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4], mask[1, :1], mask[2, -2:] = 0, 0, 0
    return ids, mask


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_family_packs_exactly_or_is_refused(model_type):
    assert set(FAMILIES) >= PACKED_ROWS_APART  # every family said to pack is in this sweep
    torch.manual_seed(0)
    model = tiny(model_type)
    assert model.config.model_type == model_type
    ids, mask = rows()
    with torch.no_grad():
        padded = completion_logps(model, ids, mask, 5).logps
        packed = completion_logps(model, ids, mask, 5, padding_free=True).logps
    if model_type in PACKED_ROWS_APART:
        torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
        return
    assert (packed - padded).abs().max() > 1e-4  # rows attend to each other: why it is refused
    with pytest.raises(ValueError, match=f"policy.padding_free=True .* model type '{model_type}' is not known"):
        Policy(model, PolicyConfig(padding_free=True))
