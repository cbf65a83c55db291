"""Vision-language batches as users bring them (issue 58 items 3 and 4): Idefics3 / SmolVLM images that split into
different tile counts in one batch, and datasets where some rows have no image (a text-only question). Each row's
log-probs equal the model's own forward of that row alone, and every batch, text-only ones too, takes its update."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from helpers import fit

from lightning_grpo.demo.vision import QUESTION, build_idefics3_processor, build_tiny_idefics3
from lightning_grpo.engines import HFGenerate
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.model.config import PolicyConfig
from lightning_grpo.model.policy import Policy

IMAGE_PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
TEXT_PROMPT = [{"role": "user", "content": "colour of grass? r g b y"}]


def splitting_idefics3():
    """The demo's tiny Idefics3 with SmolVLM's image splitting on: an image is resized to a longest edge of 112 and
    cut into tiles of 56 plus a global view, so a 112x112 image is 5 tiles and a 112x56 one 3."""
    from transformers import Idefics3ImageProcessorPil

    processor = build_idefics3_processor()
    processor.image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 112}, max_image_size={"longest_edge": 56}, do_image_splitting=True
    )
    return processor, build_tiny_idefics3(processor, seed=0)


def tiles(width: int, height: int, colour: tuple[int, int, int]):
    from PIL import Image

    return Image.new("RGB", (width, height), colour)


def row_alone_logps(model, rollout, i: int, processor, prompt, images) -> torch.Tensor:
    """[t] row i's completion log-probs from ``model(**processor(row i alone))``: no padding, no batch."""
    out = processor.apply_chat_template(
        [_placed(prompt, images)], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    width = int(rollout.completion_mask[i].sum())
    completion = rollout.completion_ids[i, :width]
    ids = torch.cat([out["input_ids"][0], completion])[None]
    inputs = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        logits = model.eval()(input_ids=ids, **inputs).logits[0]
    return logits[-width - 1 : -1].log_softmax(-1).gather(-1, completion[:, None])[:, 0]


def _placed(prompt, images):
    from trl.data_utils import prepare_multimodal_messages

    return prepare_multimodal_messages(json.loads(json.dumps(prompt)), images=list(images))


def test_idefics3_images_of_different_tile_counts_batch_as_the_processor_pads_them():
    """Issue 58 item 3: the rows' pixel_values ([1, 5, 3, 56, 56] and [1, 3, 3, 56, 56]) could not be joined
    (``Sizes of tensors must match``) at the first generate. They are joined as the processor pads a batch, padding
    tiles all zero, and each row's log-probs are its own forward's."""
    processor, model = splitting_idefics3()
    policy = Policy(model, PolicyConfig(tokenizer=processor))
    images = [[tiles(112, 112, (200, 30, 30))], [tiles(112, 56, (30, 200, 30))]]
    torch.manual_seed(0)
    rollout = HFGenerate().generate(
        policy, [IMAGE_PROMPT] * 2, 2, SamplingConfig(max_completion_length=4), False, {"images": images}
    )
    assert [tuple(t.shape[:2]) for t in rollout.vision["pixel_values"][::2]] == [(1, 5), (1, 3)]
    texts = [processor.apply_chat_template(_placed(IMAGE_PROMPT, im), add_generation_prompt=True) for im in images]
    batched = processor(text=texts, images=images, padding=True, return_tensors="pt")
    joined = rollout.vision_inputs(torch.tensor([0, 2]))
    torch.testing.assert_close(joined["pixel_values"], batched["pixel_values"], rtol=0, atol=0)
    torch.testing.assert_close(joined["pixel_attention_mask"], batched["pixel_attention_mask"], rtol=0, atol=0)
    ours = policy.logps(rollout, [slice(0, 4)])  # [N, T] the four rows in one padded forward
    for i in range(len(rollout)):
        alone = row_alone_logps(policy.model, rollout, i, processor, IMAGE_PROMPT, images[i // 2])
        torch.testing.assert_close(ours[i, : len(alone)], alone, rtol=0, atol=1e-5)


def test_mixed_image_and_text_rows_give_each_row_its_own_forward():
    """Issue 58 item 4: a batch mixing rows with and without an image raised mid-run. Each row now carries its own
    images (none for a text row; TRL's per-row image count), a forward takes those of its rows, and a text-only
    micro-batch is a text forward."""
    processor, model = splitting_idefics3()
    policy = Policy(model, PolicyConfig(tokenizer=processor))
    images = [[tiles(112, 112, (200, 30, 30))], [], [tiles(56, 112, (30, 30, 200))]]
    prompts = [IMAGE_PROMPT, TEXT_PROMPT, IMAGE_PROMPT]
    torch.manual_seed(0)
    rollout = HFGenerate().generate(
        policy, prompts, 2, SamplingConfig(max_completion_length=4), False, {"images": images}
    )
    assert [t is None for t in rollout.vision["pixel_values"]] == [False, False, True, True, False, False]
    assert policy.token_logps(rollout, slice(2, 4)).logps.shape[0] == 2  # the text rows alone: a text forward
    ours = policy.logps(rollout, [slice(0, 3), slice(3, 6)])
    for i in range(len(rollout)):
        alone = row_alone_logps(policy.model, rollout, i, processor, prompts[i // 2], images[i // 2])
        torch.testing.assert_close(ours[i, : len(alone)], alone, rtol=0, atol=1e-5)


def varied_reward(completions, **kwargs) -> list[float]:
    """A number in [0, 1) from each completion's text: groups get a spread, so every step has a gradient."""
    return [random.Random(str(c)).random() for c in completions]


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.slow
def test_tiles_and_text_only_batches_all_take_their_update(tmp_path):
    """Issue 58 items 3 and 4 through ``Trainer.fit``: a batch of two tile counts, a mixed batch and a text-only
    batch (which was dropped with no update and no error) each take one optimiser step, and the weights move."""
    from lightning_grpo import GRPOModule
    from lightning_grpo.data import PromptDataModule

    processor, model = splitting_idefics3()
    for name, size in (("square", (112, 112)), ("wide", (112, 56)), ("small", (40, 40))):
        tiles(*size, (200, 30, 30)).save(tmp_path / f"{name}.png")
    rows = [
        {"prompt": IMAGE_PROMPT, "image": str(tmp_path / "square.png")},
        {"prompt": IMAGE_PROMPT, "image": str(tmp_path / "wide.png")},  # batch 1: 5 and 3 tiles
        {"prompt": IMAGE_PROMPT, "image": str(tmp_path / "small.png")},
        {"prompt": TEXT_PROMPT, "image": None},  # batch 2: mixed
        {"prompt": TEXT_PROMPT, "image": None},
        {"prompt": TEXT_PROMPT, "image": None},  # batch 3: text only
    ]
    data = PromptDataModule(write_rows(tmp_path / "train.jsonl", rows), 2, val_split=None, shuffle_dataset=False)
    module = GRPOModule(
        model,
        reward_funcs=[varied_reward],
        num_generations=2,
        sampling={"max_completion_length": 4},
        optim={"learning_rate": 1e-2},
        policy=PolicyConfig(tokenizer=processor),
    )
    before = {n: p.detach().clone() for n, p in module.policy.model.named_parameters() if p.requires_grad}
    trainer = fit(module, data, tmp_path, max_steps=3, max_epochs=1)
    assert trainer.global_step == 3  # three batches, three optimiser steps: none dropped
    after = dict(module.policy.model.named_parameters())
    assert any((after[n] - p).abs().max() > 0 for n, p in before.items())


def test_a_text_only_batch_of_an_image_dataset_takes_its_update(tmp_path):
    """Issue 58 item 4: a batch whose rows all lack an image ended the epoch silently (an empty dict of vision inputs
    raised StopIteration inside the step, which Lightning reads as the end of the data): 2 batches, 1 optimiser
    step. It is a text batch for the vision-language policy, as TRL takes it (its ``images`` is ``None``)."""
    from lightning_grpo import GRPOModule
    from lightning_grpo.data import PromptDataModule
    from lightning_grpo.demo.vision import build_processor, build_tiny_llava, square_image

    square_image("r", random.Random(0)).save(tmp_path / "r.png")
    rows = [{"prompt": TEXT_PROMPT, "image": None}] * 2 + [{"prompt": IMAGE_PROMPT, "image": str(tmp_path / "r.png")}]
    data = PromptDataModule(write_rows(tmp_path / "t.jsonl", rows * 2), 2, val_split=None, shuffle_dataset=False)
    processor = build_processor()
    module = GRPOModule(
        build_tiny_llava(processor),
        reward_funcs=[varied_reward],
        num_generations=2,
        sampling={"max_completion_length": 4},
        policy=PolicyConfig(tokenizer=processor),
    )
    trainer = fit(module, data, tmp_path, max_steps=3, max_epochs=1)
    assert trainer.global_step == 3  # text only, then mixed, then images only


def test_one_step_on_mixed_image_and_text_rows_equals_trls_vlm_step(tmp_path):
    """Issue 58 item 2's sweep, mixed rows: a LLaVA batch of an image row and a text-only row (``None`` in a
    ``datasets`` image column), TRL 1.16's own tokenization, the processor's batched call and TRL's
    ``_compute_loss`` (its per-row ``num_images``: 1, 1, 0, 0) against ours: the same prompt ids, pixel_values, loss
    and gradient on every weight."""
    from datasets import Dataset

    from lightning_grpo.demo.vision import build_processor, build_tiny_llava, square_image
    from lightning_grpo.loss import LossConfig, grpo_loss
    from tests.model.test_vision import assert_same_gradients, trl_loss, trl_prompt_inputs, trl_trainer

    processor = build_processor()
    policy = Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor, freeze_vision_tower=False))
    theirs_model = copy.deepcopy(policy.model)
    # 4 more characters than the question for the image's 4 tokens: prompts of one length (TRL's forward counts
    # positions from the padding, ours from the first real token)
    prompts = [IMAGE_PROMPT, [{"role": "user", "content": [{"type": "text", "text": "abcd" + QUESTION}]}]]
    images = [square_image("g", random.Random(0)), None]
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=4)
    rollout = HFGenerate().generate(policy, prompts, 2, sampling, False, {"image": images})
    assert bool(rollout.prompt_mask.all())
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    token = policy.train_logps(rollout, slice(0, 4))
    ours = grpo_loss(token.logps, None, advantages, rollout.completion_mask, LossConfig(beta=0.0, loss_type="dapo"))
    ours.loss.backward()

    dataset = Dataset.from_list([{"prompt": p, "image": im} for p, im in zip(prompts, images)])
    trainer = trl_trainer(theirs_model, processor, dataset, tmp_path, 4)
    their_ids, theirs_vision, num_images = trl_prompt_inputs(trainer, [dataset[i] for i in (0, 0, 1, 1)])
    assert num_images == [1, 1, 0, 0]
    assert their_ids == rollout.prompt_ids.tolist()
    torch.testing.assert_close(rollout.vision_inputs(slice(0, 4))["pixel_values"], theirs_vision["pixel_values"])
    theirs = trl_loss(trainer, rollout, advantages, theirs_vision["pixel_values"], num_images)
    torch.testing.assert_close(ours.loss.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    assert_same_gradients(policy.model, trainer.model)


@pytest.mark.parametrize(
    "settings", [{}, {"freeze_vision_tower": False}, {"peft_config": {"r": 2, "target_modules": "all-linear"}}]
)
def test_a_text_only_micro_batch_gives_every_trainable_weight_a_gradient(settings):
    """A rank whose micro-batch has no image must still give the projector (and a trained tower) a gradient, 0:
    DDP (``find_unused_parameters=False``, Lightning's default) waits for every trainable weight's on every rank,
    and a missing one stalls the all-reduce of the ranks that had images."""
    from lightning_grpo.demo.vision import build_processor, build_tiny_llava

    processor = build_processor()
    policy = Policy(build_tiny_llava(processor, seed=1), PolicyConfig(tokenizer=processor, **settings))
    rollout = HFGenerate().generate(
        policy, [TEXT_PROMPT] * 2, 2, SamplingConfig(max_completion_length=3), False, {"image": [None, None]}
    )
    assert rollout.vision is None  # a batch without images
    policy.train_logps(rollout, slice(0, 4)).logps.sum().backward()
    trainable = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert not [n for n, p in trainable.items() if p.grad is None]
    vision = [p.grad for n, p in trainable.items() if "multi_modal_projector" in n or "vision_tower" in n]
    assert vision and all(g.abs().max() == 0 for g in vision)
