"""The families whose processor returns a per-token modality field beside the ids, tiny and built in code:
Qwen2-VL (``mm_token_type_ids``, for M-RoPE; images of different sizes give rows of different patch counts and
prompt lengths) and Gemma 3 (``token_type_ids``: attention among an image's tokens is bidirectional). Each row's
log-probs equal the model's own forward of that row alone, one step equals TRL 1.16's, and a run takes its
updates. (LLaVA is tests/model/test_vision.py's, Idefics3 test_vision_batches.py's.)

Qwen2-VL's processor is its own (its image processor, its chat template's image markers) without its video
processor, which needs torchvision's compiled ops; PyPI's torchvision is a CUDA build that does not load against
this machine's CPU torch. Qwen2.5-VL and Qwen3-VL share the field and the model code path."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import fit
from PIL import Image

from lightning_grpo.demo.tiny import SPECIAL_TOKENS, TINY_SIZES, build_tokenizer
from lightning_grpo.demo.vision import seeded_model
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
    return seeded_model(Qwen2VLForConditionalGeneration, config, tokenizer, seed)


GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
GEMMA3_TEMPLATE = TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<start_of_image>")


def gemma3_processor(folder):
    """Gemma 3's processor of the demo's byte tokenizer, its image tokens named as Gemma's tokenizer names them
    (saved and reloaded with ``extra_special_tokens``), 28x28 images of 4 soft tokens each."""
    from transformers import AutoTokenizer, Gemma3ImageProcessorPil, Gemma3Processor

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:] + list(GEMMA3_TOKENS.values())})
    tokenizer.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, extra_special_tokens=GEMMA3_TOKENS)
    tokenizer.chat_template = GEMMA3_TEMPLATE
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    return Gemma3Processor(images, tokenizer, chat_template=GEMMA3_TEMPLATE, image_seq_length=4)


def tiny_gemma3(processor, seed: int = 0):
    """Gemma 3 with a 2-layer SigLIP tower (width 32, 28x28 images of 4 patches) and the tiny Qwen2's text sizes."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tokenizer = processor.tokenizer
    boi, eoi, image = tokenizer.convert_tokens_to_ids(list(GEMMA3_TOKENS.values()))
    text = {**TINY_SIZES, "vocab_size": len(tokenizer), "head_dim": 16, "sliding_window": 8, "bos_token_id": None}
    text["layer_types"] = ["sliding_attention", "full_attention"]  # the completions see the image through the second
    text["initializer_range"] = 0.1  # sharper than 0.02: the image attention visibly moves the completions
    text |= {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = Gemma3Config(
        text_config=text,
        vision_config={**vision, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4,
        boi_token_index=boi,
        eoi_token_index=eoi,
        image_token_index=image,
        tie_word_embeddings=True,
    )
    return seeded_model(Gemma3ForConditionalGeneration, config, tokenizer, seed)


# family -> (its processor, its model, the per-token field its processor returns)
FAMILIES = {
    "qwen2_vl": (lambda folder: images_only_processor(), tiny_qwen2_vl, "mm_token_type_ids"),
    "gemma3": (gemma3_processor, tiny_gemma3, "token_type_ids"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(processor, model builder, per-token field) of each family."""
    build_processor, build_model, field = FAMILIES[request.param]
    return build_processor(tmp_path_factory.mktemp(request.param)), build_model, field


@pytest.fixture(scope="module")
def processor():
    return images_only_processor()


def images() -> list:
    """Two images of noise (each patch unlike the others: attention among identical patches hides a causal mask)
    and a text-only row's ``None``."""
    import numpy as np

    noise = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    return [Image.fromarray(noise[:28]), Image.fromarray(noise[:, ::-1].copy()), None]


def rollout_of(policy, prompts=PROMPTS, pictures=None, g: int = 2):
    torch.manual_seed(0)
    sampling = SamplingConfig(max_completion_length=4)
    pictures = images() if pictures is None else pictures
    return HFGenerate().generate(policy, prompts, g, sampling, False, {"image": pictures})


def test_rows_of_different_patch_counts_and_a_text_row_give_each_rows_own_forward(family):
    """Before: the processor's per-token field was refused ("not supported yet"), so no Qwen-VL or Gemma 3 run
    started. Now each row's log-probs equal the model's own forward of that row alone, unpadded, with the
    processor's own inputs for it (Qwen2-VL: M-RoPE positions from the left-padded batch's mask agree; Gemma 3:
    its bidirectional image attention)."""
    processor, build_model, field = family
    policy = Policy(build_model(processor), PolicyConfig(tokenizer=processor))
    rollout = rollout_of(policy)
    assert rollout.vision["pixel_values"][4] is None  # the text-only row carries no vision inputs
    assert field not in rollout.vision  # rebuilt from the ids at each call
    if field == "mm_token_type_ids":
        assert [len(v) for v in rollout.vision["pixel_values"] if v is not None] == [8, 8, 16, 16]
        assert rollout.prompt_mask.sum(1)[0] < rollout.prompt_mask.sum(1)[2]  # 2 and 4 image tokens
    assert bool((rollout.prompt_mask == 0).any())  # left-padded rows (the text row is shorter)
    with torch.no_grad():
        ours = policy.train_logps(rollout, slice(0, len(rollout))).logps
    model = policy.model
    rows = zip([p for p in PROMPTS for _ in (0, 1)], [i for i in images() for _ in (0, 1)])
    for row, (prompt, image) in enumerate(rows):
        alone = processor.apply_chat_template(
            [image_messages(prompt, [image] if image else [])], add_generation_prompt=True, tokenize=True,
            return_dict=True, return_tensors="pt",
        )  # fmt: skip
        assert bool(alone[field].any()) == (image is not None)
        n = int(rollout.completion_mask[row].sum())
        completion = rollout.completion_ids[row : row + 1, :n]
        inputs = {k: v for k, v in alone.items() if k not in ("input_ids", "attention_mask", field)}
        with torch.no_grad():
            logits = model(
                input_ids=torch.cat([alone["input_ids"], completion], 1),
                **{field: torch.cat([alone[field], torch.zeros_like(completion)], 1)},
                **inputs,
            ).logits[0, -n - 1 : -1]
        expected = logits.log_softmax(-1).gather(-1, completion[0, :, None])[:, 0]
        torch.testing.assert_close(ours[row, :n], expected, rtol=1e-5, atol=1e-5, msg=f"row {row}")


def test_one_step_equals_trls_on_images_of_two_sizes(family, tmp_path):
    """TRL 1.16's tokenization, its processor call (Qwen2-VL: ``pixel_values`` of 8 + 16 patches a pair and
    ``image_grid_thw``) with its per-token field left-padded as its prompt ids and zeros on the completions, and its
    ``_compute_loss``, against ours on the same completions and advantages: the same prompt ids, loss and gradient
    on every weight, the vision tower's too."""
    from datasets import Dataset

    from lightning_grpo.loss import LossConfig, grpo_loss
    from tests.model.test_vision import assert_same_gradients, trl_loss, trl_prompt_inputs, trl_trainer

    processor, build_model, field = family
    policy = Policy(build_model(processor, seed=1), PolicyConfig(tokenizer=processor, freeze_vision_tower=False))
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
    padded = [[0] * (rollout.prompt_ids.shape[1] - len(ids)) + ids for ids in their_ids]
    assert padded == torch.where(rollout.prompt_mask.bool(), rollout.prompt_ids, 0).tolist()
    types = theirs_vision[field]
    assert types.shape == rollout.prompt_ids.shape  # left-padded, as TRL's prompt ids
    torch.testing.assert_close(rollout.vision_inputs(slice(0, 4))["pixel_values"], theirs_vision["pixel_values"])
    extra = {k: v for k, v in theirs_vision.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
    extra[field] = torch.cat([types, torch.zeros_like(rollout.completion_ids)], 1)
    theirs = trl_loss(trainer, rollout, advantages, theirs_vision["pixel_values"], num_images, **extra)
    torch.testing.assert_close(ours.loss.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    assert_same_gradients(policy.model, trainer.model)


def test_a_run_on_images_of_two_sizes_and_text_rows_takes_its_updates(family, tmp_path):
    from lightning_grpo import GRPOModule
    from lightning_grpo.data import PromptDataModule
    from tests.model.test_vision_batches import varied_reward, write_rows

    processor, build_model, _ = family
    pictures = images()
    for i, image in enumerate(pictures[:2]):
        image.save(tmp_path / f"{i}.png")
    rows = [
        {"prompt": p, "image": str(tmp_path / f"{i}.png") if im else None}
        for i, (p, im) in enumerate(zip(PROMPTS, pictures))
    ]
    data = PromptDataModule(
        write_rows(tmp_path / "train.jsonl", rows + rows[:1]), 2, val_split=None, shuffle_dataset=False
    )
    module = GRPOModule(
        build_model(processor),
        reward_funcs=[varied_reward],
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


def test_token_type_ids_of_another_meaning_are_refused(tmp_path):
    """PaliGemma's processor also returns ``token_type_ids``, meaning its prefix and suffix, which no rule from the
    ids rebuilds: a model of a type not in ``TOKEN_TYPE_MODELS`` is refused, naming the field and the type."""
    processor = gemma3_processor(tmp_path)
    config = copy.deepcopy(tiny_gemma3(processor).config)
    config.model_type = "paligemma"
    refused = "returns them: model type 'paligemma' reads per-token 'token_type_ids': only gemma3"
    with pytest.raises(ValueError, match=refused):
        tokenize_image_prompts(processor, PROMPTS[:1], [images()[:1]], SamplingConfig(), config)


def test_a_model_reading_token_type_ids_of_another_meaning_is_refused_when_loaded():
    """PaliGemma's forward reads ``token_type_ids`` as prefix and suffix: refused as the policy is built, before a
    processor is looked up or a prompt tokenized, naming the field and the type."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    text = {**TINY_SIZES, "vocab_size": 64, "head_dim": 16}
    config = PaliGemmaConfig(
        text_config=text, vision_config={**vision, "image_size": 28, "patch_size": 14}, image_token_index=63
    )
    with pytest.raises(ValueError, match="model type 'paligemma' reads per-token 'token_type_ids': only gemma3"):
        Policy(PaliGemmaForConditionalGeneration(config))
