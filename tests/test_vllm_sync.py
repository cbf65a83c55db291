"""engines/vllm_sync.py without vLLM: what a push sends (LoRA merged, Hugging Face names, the tied LM head) and the
check that proves it arrived, on hand-worked numbers and on the tiny policy itself."""

import pytest
import torch

from lightning_grpo.engines.vllm_sync import (
    SyncCheck,
    WeightSyncError,
    check_sync,
    inference_weights,
    policy_side,
    probe_prompt,
)
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


def check(engine, policy, top, atol=1e-3):
    return SyncCheck([5, 6], torch.tensor(engine), torch.tensor(policy), torch.tensor(top), atol)


def test_engine_equal_to_the_policy_passes_and_reports_its_error():
    assert check_sync("E", 1, check([-0.5, -1.0], [-0.5004, -1.0], [-0.5, -1.0])) == {
        "vllm/sync_logp_error": pytest.approx(4e-4, abs=1e-6)
    }


def test_stale_log_probs_fail_naming_engine_step_and_difference():
    # the tokens are still the policy's top ones, but their log-probs moved by 0.02 > 1e-3: stale weights
    with pytest.raises(
        WeightSyncError,
        match=r"^VLLMColocate does not generate .* step 3: .*differ from the policy's by "
        r"up to 0.02 \(tolerance 0.001\)",
    ):
        check_sync("VLLMColocate", 3, check([-0.52, -1.0], [-0.5, -1.0], [-0.5, -1.0]))


def test_a_token_the_policy_would_not_pick_fails_at_its_position():
    # position 1: the policy's top log-prob is -0.2, the engine's token has -1.0 under the policy
    with pytest.raises(WeightSyncError, match="its token at position 1 is not the policy's top token"):
        check_sync("E", 1, check([-0.5, -1.0], [-0.5, -1.0], [-0.5, -0.2]))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_pushed_weights_are_the_models_under_hugging_face_names(tiny_model_dir, lora):
    policy = Policy(tiny_model_dir, PolicyConfig(peft_config=LORA if lora else None))
    if lora:  # a trained adapter: B != 0 changes the merged weights
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    weights = inference_weights(policy)
    merged = policy.model.merge_and_unload() if lora else policy.model
    expected = merged.state_dict()
    assert set(weights) == set(expected) | {"lm_head.weight"}  # the tied head listed under its own name
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert weights["lm_head.weight"].data_ptr() != weights["model.embed_tokens.weight"].data_ptr()


def test_the_policy_checked_against_itself_passes_and_against_a_stale_copy_fails(tiny_model_dir):
    policy = Policy(tiny_model_dir)
    prompt = probe_prompt(policy)
    with torch.no_grad():
        ids = policy.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=4, min_new_tokens=4)
        logits = policy.model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    tokens = ids[0, len(prompt) :].tolist()
    logps = logits.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()
    assert policy_side(policy, prompt, tokens, logps, 1e-3).ok  # an engine with the policy's weights
    with torch.no_grad():  # one optimiser step's worth of change, which the engine did not get
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    assert not policy_side(policy, prompt, tokens, logps, 1e-3).ok
