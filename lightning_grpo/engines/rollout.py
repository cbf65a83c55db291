"""Sampled token ids -> a ``Rollout``: what every engine shares once it has sampled (masks after EOS, the one
read of the rows, decoded texts, another sampler's token lists, generation chunks). Knows the policy's tokenizer;
nothing about rewards or losses."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.prompts import is_conversational, tokenize_image_prompts, tokenize_prompts
from lightning_grpo.images import column_images
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import HostRows, Prompt, Rollout, pad_rows


def mask_after_eos(completion_ids: Tensor, eos_token_ids: list[int]) -> tuple[Tensor, Tensor]:
    """[N, T] mask of tokens up to and including the first EOS, and [N] truncated flags (no EOS)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))  # [N, T]
    has_eos = is_eos.any(dim=1)  # [N]
    length = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), length)  # [N]
    positions = torch.arange(length, device=completion_ids.device).unsqueeze(0)  # [1, T]
    return (positions <= first_eos.unsqueeze(1)).long(), ~has_eos


def build_rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    eos_ids: list[int],
    group_size: int,
    num_truncated_prompts: int = 0,
    sampling_logps: Tensor | None = None,
) -> Rollout:
    """A Rollout from sampled ids ([N, P] prompts repeated G times, [N, T] completions): masks after the first
    EOS, padding columns trimmed, texts decoded (as chat messages for chat prompts)."""
    completion_mask, is_truncated = mask_after_eos(completion_ids, eos_ids)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    host = HostRows.read(prompt_ids, prompt_mask, completion_ids, completion_mask)  # the one read of the rollout
    width = host.width  # trim columns that are padding in every row
    texts = tokenizer.batch_decode(host.completion_ids, skip_special_tokens=True)
    repeated = [p for p in prompts for _ in range(group_size)]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(prompts[0]) else texts
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids[:, :width],
        completion_mask=completion_mask[:, :width],
        is_truncated=is_truncated,
        prompts=repeated,
        completions=completions,
        group_size=group_size,
        num_truncated_prompts=num_truncated_prompts,
        sampling_logps=None if sampling_logps is None else sampling_logps[:, :width],
    )
    return rollout.known_on_host(host)


def sampled_rollout(
    policy: Policy,
    prompts: list[Prompt],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completions: list[list[int]],
    logps: list[list[float]],
    num_generations: int,
    num_truncated_prompts: int,
) -> Rollout:
    """A Rollout from another sampler's output (vLLM): G completions per prompt as token lists, prompt-major,
    with the log-prob of each sampled token, for the sampling correction."""
    tokenizer, device = policy.tokenizer, policy.device
    completion_ids, _ = pad_rows(completions, tokenizer.pad_token_id, min_width=1)  # [N, T]
    sampling_logps, _ = pad_rows(logps, 0.0, dtype=torch.float32, min_width=1)  # [N, T]
    return build_rollout(
        tokenizer,
        prompts,
        prompt_ids.repeat_interleave(num_generations, 0).to(device),
        prompt_mask.repeat_interleave(num_generations, 0).to(device),
        completion_ids.to(device),
        policy.eos_token_ids,
        num_generations,
        num_truncated_prompts,
        sampling_logps.to(device),
    )


def pad_right(rows: list[Tensor], pad_id: int) -> Tensor:
    """[n_i, T_i] blocks -> [sum n_i, max T_i], padded on the right."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=pad_id) for r in rows])


def cut_turns(
    rows: list[list[int]], logps: list[list[float]] | None, budgets: list[int], eos: list[int]
) -> list[tuple[list[int], list[float] | None]]:
    """A sampler's ``complete`` answer: each decoded row up to its first EOS (included) or its budget, with its
    log-probs (``None``: the sampler records none).

    >>> cut_turns([[5, 1, 7], [5, 6, 7]], None, [3, 2], eos=[1])
    [([5, 1], None), ([5, 6], None)]
    """
    turns = []
    for i, (row, budget) in enumerate(zip(rows, budgets)):
        cut = min(next((j + 1 for j, t in enumerate(row) if t in eos), len(row)), budget)
        turns.append((row[:cut], logps[i][:cut] if logps is not None else None))
    return turns


def generation_chunks(num_prompts: int, num_generations: int, generation_batch_size: int | None) -> list[slice]:
    """The prompts generated together: whole groups, at most ``generation_batch_size`` completions a call (at
    least one group); ``None``: all of them at once.

    >>> generation_chunks(5, 4, 8)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 6, None)]
    """
    per_call = max(1, (generation_batch_size or num_prompts * num_generations) // num_generations)
    return [slice(i, i + per_call) for i in range(0, num_prompts, per_call)]


def check_generation_batch_size(generation_batch_size: int | None) -> int | None:
    if generation_batch_size is not None and generation_batch_size < 1:
        raise ValueError(f"generation_batch_size must be None or >= 1, got {generation_batch_size}")
    return generation_batch_size


class PromptIds(NamedTuple):
    """A batch's prompts as the policy reads them, before anything is sampled: what ``tokenized_prompts`` hands
    every engine. A tuple, so ``ids, mask, num_truncated, vision = tokenized_prompts(...)`` unpacks it too."""

    ids: Tensor  # [B, P] left-padded
    mask: Tensor  # [B, P]
    num_truncated: int  # prompts longer than sampling.max_prompt_length, which kept their last tokens
    vision: dict[str, list[Tensor | None]] | None  # name -> [B] a prompt's tensors (None: it has no image); None: text

    def repeated(self, num_generations: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """[N, P] ids and mask on ``device``: each prompt's row once for each of its G completions, prompt-major."""
        ids = self.ids.repeat_interleave(num_generations, 0)  # [N, P]
        mask = self.mask.repeat_interleave(num_generations, 0)  # [N, P]
        return ids.to(device), mask.to(device)


def tokenized_prompts(
    policy: Policy, prompts: list[Prompt], sampling: SamplingConfig, columns: dict[str, list[Any]] | None = None
) -> PromptIds:
    """The prompts of a batch as the policy reads them, the one prelude of every engine: chat template applied,
    cut to ``sampling.max_prompt_length``, left-padded; prompts with images (an ``image``/``images`` column in
    ``columns``) through the policy's processor, never cut. ``columns``: the batch's, for an engine that carries
    images to generation (``takes_images``); ``None``: text prompts."""
    images = column_images(columns)
    if images is None:
        return PromptIds(*tokenize_prompts(policy.tokenizer, prompts, sampling), None)
    if policy.processor is None:
        raise ValueError(
            "the prompts have images (an 'image'/'images' column) but the policy is a text model: give an "
            "AutoModelForImageTextToText model (references/vision.md), or drop the column"
        )
    ids, mask, vision = tokenize_image_prompts(policy.processor, prompts, images, sampling, policy.model.config)
    return PromptIds(ids, mask, 0, vision)


def vision_per_completion(
    vision: dict[str, list[Tensor | None]] | None, num_generations: int, device: torch.device
) -> dict[str, list[Tensor | None]] | None:
    """Each prompt's vision inputs for each of its G completions: one tensor on ``device`` per prompt, referenced
    G times (not copied); ``None`` stays ``None`` (a prompt without images)."""
    if vision is None:
        return None
    return {
        name: [moved for t in per_prompt for moved in [None if t is None else t.to(device)] * num_generations]
        for name, per_prompt in vision.items()
    }
