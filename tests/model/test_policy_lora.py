"""LoRA: only the adapter trains, the reference is the adapter-off policy, checkpoints hold the adapter only."""

import pytest
import torch
from helpers import fit, logged, make_module
from peft import PeftModel
from transformers import AutoModelForCausalLM

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.callbacks import HFExport
from lightning_grpo.rewards import exact_match_reward

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def test_lora_run(tiny_model_dir, arith_jsonl, tmp_path):
    module = make_module(tiny_model_dir, policy={"peft_config": LORA}, loss={"beta": 0.1})
    assert module.policy.reference is None  # no second model: the reference is the adapter-off policy
    base = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if "lora_" not in n}
    lora = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if "lora_B" in n}
    export = HFExport(merged=True)
    trainer = fit(
        module,
        PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
        tmp_path,
        max_steps=3,
        enable_checkpointing=True,
        callbacks=[export],
    )
    params = dict(module.policy.model.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items())  # base weights untouched
    assert any(not torch.equal(params[n], v) for n, v in lora.items())  # adapter trained
    assert logged(trainer)["train/kl"][-1] > 0  # policy vs adapter-off reference

    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    assert ckpt["state_dict"] and all("lora_" in k for k in ckpt["state_dict"])

    # the adapter, as PEFT and TRL save it, and the merged model beside it: both give the trained policy's logits
    assert (export.path / "adapter_config.json").exists() and not (export.path / "model.safetensors").exists()
    ids = torch.tensor([[3, 5, 7, 2]])
    trained = module.policy.model.eval()(ids).logits
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), export.path)
    merged = AutoModelForCausalLM.from_pretrained(export.path / "merged")
    torch.testing.assert_close(adapter.eval()(ids).logits, trained)
    torch.testing.assert_close(merged.eval()(ids).logits, trained, rtol=1e-4, atol=1e-5)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    q_merged = merged.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_merged, original.model.layers[0].self_attn.q_proj.weight)

    resumed = make_module(tiny_model_dir, policy={"peft_config": LORA}, loss={"beta": 0.1})
    fit(
        resumed,
        PromptDataModule(arith_jsonl, batch_size=4, val_split=None),
        tmp_path,
        max_steps=4,
        ckpt_path=trainer.checkpoint_callback.best_model_path,
    )
    restored = dict(resumed.policy.model.named_parameters())
    assert all(torch.equal(restored[n], v) for n, v in base.items())


def test_bad_peft_config_is_named(tiny_model_dir):
    with pytest.raises(ValueError, match="peft_config .* is not valid for peft.LoraConfig"):
        GRPOModule(model=tiny_model_dir, reward_funcs=[exact_match_reward], policy={"peft_config": {"rank": 4}})
