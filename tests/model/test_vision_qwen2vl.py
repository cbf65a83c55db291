"""Qwen2-VL, the first family references/vision.md lists: images of different sizes give rows of different patch
counts and prompt lengths, and M-RoPE takes ``mm_token_type_ids`` (which tokens are an image's), which
transformers 5.24's processor returns and its model requires. Each row's log-probs equal the model's own forward
of that row alone, one step equals TRL 1.16's, and a run takes its updates.

The processor: Qwen2-VL's own (its image processor, its chat template's image markers) without its video
processor, which needs torchvision's compiled ops; PyPI's torchvision is a CUDA build that does not load against
this machine's CPU torch. Qwen2.5-VL and Qwen3-VL share the field and the model code path."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import fit
from PIL import Image

from lightning_grpo.demo.tiny import SPECIAL_TOKENS, TINY_SIZES, build_tokenizer
from lightning_grpo.engines import HFGenerate
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import image_messages, tokenize_image_prompts
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
QUESTION = [{"type": "image"}, {"type": "text", "text": "colour?"}]
PROMPTS = [[{"role": "user", "content": QUESTION}]] * 2 + [[{"role": "user", "content": "colour of grass?"}]]


def images_only_processor():
    """Qwen2-VL's processor of the demo's byte tokenizer (its vision tokens added) and Qwen2-VL's PIL image
    processor (patches of 14, merged 2 x 2: a 56x28 image is 8 patches, 2 image tokens; 56x56 is 16 and 4)."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImagesOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:] + VISION_TOKENS})
    tokenizer.chat_template = TEMPLATE
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56)
    return ImagesOnlyQwen2VLProcessor(images, tokenizer, chat_template=TEMPLATE)


def tiny_qwen2_vl(processor, seed: int = 0):
    """Qwen2-VL with a 2-block vision tower (width 32) and the tiny Qwen2's text sizes, M-RoPE sections 2/3/3."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = processor.tokenizer
    special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "eos")}
    ids = dict(zip(("vision_start", "vision_end", "image", "video"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    config = Qwen2VLConfig(
        text_config={
            **TINY_SIZES,
            "vocab_size": len(tokenizer),
            "rope_parameters": rope,
            "bos_token_id": None,
            **special,
        },
        vision_config={"depth": 2, "embed_dim": 32, "num_heads": 2, "hidden_size": TINY_SIZES["hidden_size"]},
        **{f"{name}_token_id": i for name, i in ids.items()},
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@pytest.fixture(scope="module")
def processor():
    return images_only_processor()


def images() -> list:
    return [Image.new("RGB", (56, 28), (200, 30, 30)), Image.new("RGB", (56, 56), (30, 30, 200)), None]


def rollout_of(policy, prompts=PROMPTS, pictures=None, g: int = 2):
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=4)
    pictures = images() if pictures is None else pictures
    return HFGenerate().generate(policy, prompts, g, sampling, False, {"image": pictures})


def test_rows_of_different_patch_counts_and_a_text_row_give_each_rows_own_forward(processor):
    """Before: the processor's ``mm_token_type_ids`` was refused ("not supported yet"), so no Qwen-VL run started.
    Now each row's log-probs equal the model's own forward of that row alone, unpadded, with the processor's own
    inputs for it (M-RoPE positions from the left-padded batch's mask agree)."""
    policy = Policy(tiny_qwen2_vl(processor), PolicyConfig(tokenizer=processor))
    rollout = rollout_of(policy)
    assert [len(v) for v in rollout.vision["image_grid_thw"] if v is not None] == [1] * 4
    assert [len(v) for v in rollout.vision["pixel_values"] if v is not None] == [8, 8, 16, 16]
    assert rollout.vision["pixel_values"][4] is None  # the text-only row carries no vision inputs
    lengths = rollout.prompt_mask.sum(1).tolist()
    assert lengths[0] < lengths[2] and lengths[4] != lengths[2]  # left-padded rows
    with torch.no_grad():
        ours = policy.train_logps(rollout, slice(0, len(rollout))).logps
    model = policy.model
    for row, (prompt, image) in enumerate(
        zip([p for p in PROMPTS for _ in (0, 1)], [i for i in images() for _ in (0, 1)])
    ):
        alone = processor.apply_chat_template(
            [image_messages(prompt, [image] if image else [])], add_generation_prompt=True, tokenize=True,
            return_dict=True, return_tensors="pt",
        )  # fmt: skip
        assert ("mm_token_type_ids" in alone) and bool(alone["mm_token_type_ids"].any()) == (image is not None)
        n = int(rollout.completion_mask[row].sum())
        completion = rollout.completion_ids[row : row + 1, :n]
        inputs = {k: v for k, v in alone.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
        with torch.no_grad():
            logits = model(
                input_ids=torch.cat([alone["input_ids"], completion], 1),
                mm_token_type_ids=torch.cat([alone["mm_token_type_ids"], torch.zeros_like(completion)], 1),
                **inputs,
            ).logits[0, -n - 1 : -1]
        expected = logits.log_softmax(-1).gather(-1, completion[0, :, None])[:, 0]
        torch.testing.assert_close(ours[row, :n], expected, rtol=1e-5, atol=1e-5, msg=f"row {row}")


def test_one_step_equals_trls_on_images_of_two_sizes(processor, tmp_path):
    """TRL 1.16's tokenization, its processor call (``pixel_values`` of 8 + 16 patches a pair, ``image_grid_thw``,
    left-padded ``mm_token_type_ids``) and ``_compute_loss`` against ours on the same completions and advantages:
    the same prompt ids, loss and gradient on every weight, the vision tower's too."""
    from datasets import Dataset

    from lightning_grpo.loss import LossConfig, grpo_loss
    from tests.model.test_vision import assert_same_gradients, trl_loss, trl_prompt_inputs, trl_trainer

    policy = Policy(tiny_qwen2_vl(processor, seed=1), PolicyConfig(tokenizer=processor, freeze_vision_tower=False))
    theirs_model = copy.deepcopy(policy.model)
    pictures = images()[:2]
    rollout = rollout_of(policy, PROMPTS[:2], pictures)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    token = policy.train_logps(rollout, slice(0, 4))
    ours = grpo_loss(token.logps, None, advantages, rollout.completion_mask, LossConfig(beta=0.0, loss_type="dapo"))
    ours.loss.backward()

    dataset = Dataset.from_list([{"prompt": p, "image": im} for p, im in zip(PROMPTS[:2], pictures)])
    trainer = trl_trainer(theirs_model, processor, dataset, tmp_path, 4)
    their_ids, theirs_vision, num_images = trl_prompt_inputs(trainer, [dataset[i] for i in (0, 0, 1, 1)])
    assert len(their_ids[0]) < len(their_ids[2])  # TRL's unpadded prompts, 2 and 4 image tokens
    padded = [[0] * (rollout.prompt_ids.shape[1] - len(ids)) + ids for ids in their_ids]
    assert padded == torch.where(rollout.prompt_mask.bool(), rollout.prompt_ids, 0).tolist()
    types = theirs_vision["mm_token_type_ids"]
    assert types.shape == rollout.prompt_ids.shape and int(types[0, 0]) == 0  # left-padded, as TRL's prompt ids
    torch.testing.assert_close(rollout.vision_inputs(slice(0, 4))["pixel_values"], theirs_vision["pixel_values"])
    completion_types = torch.cat([types, torch.zeros_like(rollout.completion_ids)], 1)
    theirs = trl_loss(
        trainer, rollout, advantages, theirs_vision["pixel_values"], num_images,
        image_grid_thw=theirs_vision["image_grid_thw"], mm_token_type_ids=completion_types,
    )  # fmt: skip
    torch.testing.assert_close(ours.loss.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    assert_same_gradients(policy.model, trainer.model)


def test_a_run_on_images_of_two_sizes_and_text_rows_takes_its_updates(processor, tmp_path):
    from lightning_grpo import GRPOModule
    from lightning_grpo.data import PromptDataModule

    pictures = images()
    for i, image in enumerate(pictures[:2]):
        image.save(tmp_path / f"{i}.png")
    rows = [
        {"prompt": p, "image": str(tmp_path / f"{i}.png") if im else None}
        for i, (p, im) in enumerate(zip(PROMPTS, pictures))
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]))
    data = PromptDataModule(str(path), 2, val_split=None, shuffle_dataset=False)
    module = GRPOModule(
        tiny_qwen2_vl(processor),
        reward_funcs=[lambda completions, **k: [float(len(str(c)) % 3) for c in completions]],
        num_generations=2,
        sampling={"max_completion_length": 4},
        optim={"learning_rate": 1e-2},
        policy=PolicyConfig(tokenizer=processor),
    )
    before = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if p.requires_grad}
    trainer = fit(module, data, tmp_path, max_steps=2, max_epochs=1)
    assert trainer.global_step == 2  # an image pair of two sizes, then a mixed batch
    after = dict(module.policy.model.named_parameters())
    assert any((after[n] - p).abs().max() > 0 for n, p in before.items())


def test_a_processor_whose_image_token_is_not_the_models_is_refused(processor):
    config = copy.deepcopy(tiny_qwen2_vl(processor).config)
    config.image_token_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    with pytest.raises(ValueError, match="mm_token_type_ids.*disagree on their token ids"):
        tokenize_image_prompts(processor, PROMPTS[:1], [images()[:1]], SamplingConfig(), config)
