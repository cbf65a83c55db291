"""Meta-device initialisation in one process: the policy built with no weights, then loaded from its files, equals
the policy loaded whole (FSDP2's per-rank shards: tests/model/test_sharding.py)."""

import shutil
from pathlib import Path

import pytest
import torch

from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def on_meta(model_dir, **kw) -> Policy:
    with torch.device("meta"):  # what Lightning's trainer.init_module(empty_init=True) sets under FSDP2
        return policy(model_dir, **kw)


def policy(model_dir, reference=False, **config) -> Policy:
    return Policy(model_dir, PolicyConfig(**config), reference=reference)


@pytest.mark.parametrize("kw", [{"reference": True}, {"peft_config": LORA}], ids=["reference", "lora"])
def test_loaded_from_the_files_equals_loaded_whole(kw, tiny_model_dir):
    torch.manual_seed(0)
    whole = policy(tiny_model_dir, **kw)
    torch.manual_seed(0)
    empty = on_meta(tiny_model_dir, **kw)
    assert all(p.is_meta for n, p in empty.model.named_parameters() if "lora_" not in n)  # adapters: made real
    empty.materialize()
    expected = {**dict(whole.named_parameters()), **dict(whole.named_buffers())}
    loaded = {**dict(empty.named_parameters()), **dict(empty.named_buffers())}
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0, msg=name)  # RoPE's inv_freq recomputed
    assert empty.model.generation_config.eos_token_id == whole.model.generation_config.eos_token_id
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(empty.model(ids).logits, whole.model(ids).logits)


def test_a_model_without_safetensors_files_is_refused_before_any_compute(tiny_model_dir, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no model.safetensors
        shutil.copy(Path(tiny_model_dir, name), tmp_path / name)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        on_meta(str(tmp_path))


def test_4bit_on_meta_is_refused(tiny_model_dir):
    config = PolicyConfig(peft_config=LORA)
    object.__setattr__(config, "load_in_4bit", True)  # as on a GPU machine, where the setting itself checks out
    with pytest.raises(ValueError, match="load_in_4bit=True with meta-device"), torch.device("meta"):
        Policy(tiny_model_dir, config)


def test_an_adapter_initialised_from_the_base_weights_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="init_lora_weights='pissa'"):
        on_meta(tiny_model_dir, peft_config={**LORA, "init_lora_weights": "pissa"})
