"""Prompts -> token ids as the policy reads them: chat templates, the prompt-length cut, a vision-language
processor's image tokens. Knows the tokenizer or processor; nothing of a model or of sampling."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.images import open_image
from lightning_grpo.model.vision import MODALITY_FIELD, modality_ids, token_types_problem
from lightning_grpo.types import Prompt, pad_rows


def is_conversational(prompt: Prompt) -> bool:
    return isinstance(prompt, list)


def render_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[list[dict]] | None = None,
) -> list[str]:
    """Chat messages go through the tokenizer's chat template (TRL's ``maybe_apply_chat_template``, with
    ``chat_template_kwargs``, and each prompt's tool schemas when ``tools`` gives them); plain text is used as is."""
    if not is_conversational(prompts[0]):
        return list(prompts)
    if tokenizer.chat_template is None and "chat_template" not in (chat_template_kwargs or {}):
        raise ValueError(
            "prompts are chat messages but the tokenizer has no chat_template: give plain-text prompts or a "
            "tokenizer with a chat template"
        )
    from trl.data_utils import maybe_apply_chat_template  # pyarrow and datasets: only for chat prompts

    kwargs = chat_template_kwargs or {}
    rows = tools or [None] * len(prompts)  # each prompt's tool schemas
    return [maybe_apply_chat_template({"prompt": p}, tokenizer, t, **kwargs)["prompt"] for p, t in zip(prompts, rows)]


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    sampling: SamplingConfig,
    tools: list[list[dict]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[list[int]]:
    """The token ids of each prompt as the policy reads it (chat template applied, with each prompt's ``tools``),
    before any cut. ``template_kwargs``: in place of ``sampling.chat_template_kwargs`` (a tool family's
    ``ToolFormat.render_kwargs``, its training template among them)."""
    kwargs = sampling.chat_template_kwargs if template_kwargs is None else template_kwargs
    texts = render_prompts(tokenizer, prompts, kwargs, tools)
    return tokenizer(texts, add_special_tokens=not is_conversational(prompts[0]))["input_ids"]


def cut_prompts(encoded: list[list[int]], sampling: SamplingConfig) -> tuple[list[list[int]], int]:
    """Each prompt cut to its last ``sampling.max_prompt_length`` tokens, and how many were longer."""
    limit = sampling.max_prompt_length
    if not limit:
        return encoded, 0
    return [ids[-limit:] for ids in encoded], sum(len(ids) > limit for ids in encoded)


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], sampling: SamplingConfig
) -> tuple[Tensor, Tensor, int]:
    """Left-padded [B, P] ids and mask; prompts longer than ``sampling.max_prompt_length`` keep their last tokens."""
    encoded, num_truncated = cut_prompts(encode_prompts(tokenizer, prompts, sampling), sampling)
    ids, mask = pad_rows(encoded, tokenizer.pad_token_id, left=True)
    return ids, mask, num_truncated


# Per-token vision fields (each token's modality): rebuilt from the ids at every call (``model.vision.
# modality_inputs``), once checked here to be that rule for the model; never carried in the rollout.
PER_TOKEN_VISION = ("token_type_ids", MODALITY_FIELD)


def tokenize_image_prompts(
    processor: Any, prompts: list[Prompt], images: list[list[Any]], sampling: SamplingConfig, config: Any = None
) -> tuple[Tensor, Tensor, dict[str, list[Tensor | None]] | None]:
    """Left-padded [B, P] ids (the processor's image tokens in them) and mask, and the vision inputs of each prompt
    (name -> [B] tensors, its images along dim 0; ``None`` for a prompt without images, and ``None`` for a batch
    where none has any), each prompt processed with its own images as TRL 1.16 does (``prepare_multimodal_messages``,
    then the processor's chat template). A prompt is never cut: cutting would drop image tokens its images fill.
    ``config``: the model's, whose image and video token ids give ``mm_token_type_ids`` where the processor
    returns it."""
    encoded, per_row = [], []
    for prompt, row in zip(prompts, images):
        out = processor.apply_chat_template(
            [image_messages(prompt, row)],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            **(sampling.chat_template_kwargs or {}),
        )
        encoded.append(out["input_ids"][0].tolist())
        _check_per_token_fields(out, config)
        kept = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", *PER_TOKEN_VISION)}
        per_row.append({k: v for k, v in kept.items() if row and isinstance(v, Tensor)})
    _check_image_prompts(encoded, sampling.max_prompt_length)
    ids, mask = pad_rows(encoded, processor.tokenizer.pad_token_id, left=True)
    names = {name: None for row in per_row for name in row}  # in the processor's order
    return ids, mask, {name: [row.get(name) for row in per_row] for name in names} or None


def _check_per_token_fields(out: Any, config: Any) -> None:
    """A processor's per-token field is one the forwards rebuild exactly from the ids, or it is refused."""
    for field in (f for f in PER_TOKEN_VISION if f in out):
        if field == "token_type_ids" and (problem := token_types_problem(getattr(config, "model_type", None))):
            raise ValueError(f"the processor returns them: {problem}")
        if config is None or not torch.equal(out[field], modality_ids(out["input_ids"], config)):
            raise ValueError(
                f"the processor's {field!r} is not 1 on the model config's image tokens and 2 on its video tokens: "
                "the processor and the model disagree on their token ids (model.policy.tokenizer names another)"
            )


def image_messages(prompt: Prompt, images: list[Any]) -> list[dict[str, Any]]:
    """A prompt as chat messages with its images opened and placed (TRL 1.16's ``prepare_multimodal_messages``: an
    image part each, in front of the first user message where the prompt marks none)."""
    from trl.data_utils import prepare_multimodal_messages

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return prepare_multimodal_messages(messages, images=[open_image(x) for x in images])


def _check_image_prompts(encoded: list[list[int]], limit: int | None) -> None:
    longest = max(len(ids) for ids in encoded)
    if limit and longest > limit:
        raise ValueError(
            f"a prompt with images is {longest} tokens (its image tokens included), longer than "
            f"sampling.max_prompt_length={limit}, and cutting it would drop image tokens: raise it or set it to null"
        )
