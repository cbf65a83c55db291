"""A vision-language policy with a LoRA adapter (issue 58 items 5 and 6): what trains under LoRA is what trains
without it (the projector always, the vision tower when ``freeze_vision_tower: false``), checked on the weights
after a real optimiser step, and the merged export rebuilds the model with its own auto class and reloads with
transformers giving the trained policy's logits."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from lightning_grpo.demo.vision import QUESTION, build_processor, build_tiny_llava, square_image
from lightning_grpo.engines import HFGenerate
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.loss import LossConfig, grpo_loss
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def lora_policy(processor, **settings) -> Policy:
    return Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor, peft_config=LORA, **settings))


def merged_weights(policy: Policy) -> dict[str, torch.Tensor]:
    """The weights the policy computes with: base + adapter merged, a module trained in full in its trained copy."""
    return {n: t.detach().clone() for n, t in copy.deepcopy(policy.model).merge_and_unload().state_dict().items()}


def one_step(policy: Policy) -> None:
    """One GRPO update of the trainable weights (AdamW) on sampled image prompts with advantages of both signs."""
    rng = random.Random(0)
    columns = {"image": [square_image(c, rng) for c in "rgby"]}
    torch.manual_seed(0)
    rollout = HFGenerate().generate(policy, [PROMPT] * 4, 2, SamplingConfig(max_completion_length=4), False, columns)
    advantages = torch.tensor([1.0, -1.0] * 4)
    logps = policy.train_logps(rollout, slice(0, len(rollout))).logps
    grpo_loss(logps, None, advantages, rollout.completion_mask, LossConfig(beta=0.0)).loss.backward()
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-2)
    optimizer.step()


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], part: str) -> bool:
    names = [n for n in before if f".{part}." in f".{n}"]
    assert names, part
    return any(not torch.equal(before[n], after[n]) for n in names)


@pytest.mark.parametrize(
    "settings, tower_trains",
    [({}, False), ({"freeze_vision_tower": False}, True), ({"lora_vision_tower": True}, True)],
)
def test_under_lora_the_projector_trains_and_the_tower_when_asked(processor, settings, tower_trains):
    """Issue 58 item 5: the projector got no adapter and PEFT froze it, so it never trained, and
    ``freeze_vision_tower: false`` trained nothing of the tower, silently. The projector now trains in full
    (``modules_to_save``), the tower in full with ``freeze_vision_tower: false`` or through its adapters with
    ``lora_vision_tower: true``; the language model through its adapter."""
    policy = lora_policy(processor, **settings)
    before = merged_weights(policy)
    one_step(policy)
    after = merged_weights(policy)
    assert changed(before, after, "multi_modal_projector")
    assert changed(before, after, "language_model")
    assert changed(before, after, "vision_tower") is tower_trains


def test_the_adapter_off_reference_is_the_untrained_model_projector_included(processor):
    """The reference under LoRA (``beta > 0``) is the adapter-off policy: after a step it still gives the untrained
    model's log-probs, so it sees neither the adapter nor the projector's trained copy."""
    policy = Policy(
        build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor, peft_config=LORA), reference=True
    )
    untrained = Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor))
    one_step(policy)
    columns = {"image": [square_image(c, random.Random(2)) for c in "rgby"]}
    rollout = HFGenerate().generate(policy, [PROMPT] * 4, 2, SamplingConfig(max_completion_length=3), False, columns)
    rows = [slice(0, len(rollout))]
    torch.testing.assert_close(policy.reference_logps(rollout, rows), untrained.logps(rollout, rows))
    assert (policy.logps(rollout, rows) - untrained.logps(rollout, rows)).abs().max() > 1e-4  # the policy moved


def test_lora_sits_on_the_language_model_and_the_projector_trains_in_full(processor):
    adapted = {n for n, p in lora_policy(processor).model.named_parameters() if p.requires_grad}
    assert {n for n in adapted if "lora_" in n} and all("language_model" in n for n in adapted if "lora_" in n)
    in_full = {n for n in adapted if "lora_" not in n}
    assert in_full and all("multi_modal_projector.modules_to_save" in n for n in in_full)


def logits_of(model, rollout) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(
            input_ids=rollout.input_ids, attention_mask=rollout.attention_mask, **rollout.vision_inputs(slice(0, 8))
        ).logits


def test_merged_export_of_a_vlm_lora_run_reloads_with_transformers_and_the_same_logits(processor, tmp_path):
    """Issue 58 item 6 (one process): the merged export of a trained VLM + LoRA policy is a whole
    ``AutoModelForImageTextToText`` with its processor, whose logits are the policy's."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    policy = lora_policy(processor, freeze_vision_tower=False)
    one_step(policy)
    policy.save_pretrained(str(tmp_path), is_global_zero=True, merged=True)
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "merged")
    assert AutoProcessor.from_pretrained(tmp_path / "merged").image_processor is not None
    columns = {"image": [square_image(c, random.Random(1)) for c in "rgby"]}
    rollout = HFGenerate().generate(policy, [PROMPT] * 4, 2, SamplingConfig(max_completion_length=3), True, columns)
    torch.testing.assert_close(logits_of(reloaded, rollout), logits_of(policy.model, rollout), rtol=1e-5, atol=1e-5)


def test_the_gathered_merge_rebuilds_a_vlm_with_its_own_auto_class(processor):
    """Issue 58 item 6 (the FSDP2 path, ``merged_lora``): the merge of a sharded policy's gathered weights rebuilt
    the base with ``AutoModelForCausalLM``, which refuses a LLaVA config: the run ended with an exception after
    training, the export unpublished. It now rebuilds a ``LlavaForConditionalGeneration`` with the same weights."""
    from lightning_grpo.model.loading import merged_lora

    policy = lora_policy(processor, freeze_vision_tower=False)
    one_step(policy)
    state = {n: t.detach().clone() for n, t in policy.model.state_dict().items()}  # what full_state_dict gathers
    whole = merged_lora(policy.model, state)
    assert type(whole).__name__ == "LlavaForConditionalGeneration"
    expected = merged_weights(policy)
    assert set(whole.state_dict()) == set(expected)
    for name, weight in whole.state_dict().items():
        torch.testing.assert_close(weight, expected[name], rtol=0, atol=1e-6, msg=name)
