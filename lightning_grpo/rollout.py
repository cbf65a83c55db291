"""Prompts -> sampled completions with masks. Knows the policy and tokenizer; nothing about rewards.

One batched ``generate`` call per step for all B*G completions, under ``torch.no_grad()`` (not
``inference_mode``, which breaks sharded models), with the KV cache on and gradient checkpointing off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from lightning_grpo.types import Prompt, Rollout


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float | None = None
    repetition_penalty: float = 1.0
    max_completion_length: int = 256

    def generation_config(self, tokenizer: PreTrainedTokenizerBase, greedy: bool = False) -> GenerationConfig:
        sampling = (
            {}
            if greedy
            else {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "min_p": self.min_p,
            }
        )
        return GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=self.max_completion_length,
            repetition_penalty=self.repetition_penalty,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=True,
            **sampling,
        )


def is_conversational(prompt: Prompt) -> bool:
    return isinstance(prompt, list)


def render_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt]) -> list[str]:
    """Chat messages go through the tokenizer's chat template; plain text is used as is."""
    if is_conversational(prompts[0]) and tokenizer.chat_template is None:
        raise ValueError(
            "prompts are chat messages but the tokenizer has no chat_template: give plain-text prompts or a "
            "tokenizer with a chat template"
        )
    return [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if is_conversational(p) else p
        for p in prompts
    ]


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], max_prompt_length: int | None
) -> tuple[Tensor, Tensor, int]:
    """Left-padded [B, P] ids and mask; prompts longer than max_prompt_length keep their last tokens."""
    texts = render_prompts(tokenizer, prompts)
    encoded = tokenizer(texts, add_special_tokens=not is_conversational(prompts[0]))["input_ids"]
    too_long = [ids for ids in encoded if max_prompt_length and len(ids) > max_prompt_length]
    if max_prompt_length:
        encoded = [ids[-max_prompt_length:] for ids in encoded]
    width = max(len(ids) for ids in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, seq in enumerate(encoded):
        if seq:
            ids[row, -len(seq) :] = torch.tensor(seq)
            mask[row, -len(seq) :] = 1
    return ids, mask, len(too_long)


def mask_after_eos(completion_ids: Tensor, eos_token_ids: list[int]) -> tuple[Tensor, Tensor]:
    """[N, T] mask of tokens up to and including the first EOS, and [N] truncated flags (no EOS)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))  # [N, T]
    has_eos = is_eos.any(dim=1)  # [N]
    length = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), length)  # [N]
    positions = torch.arange(length, device=completion_ids.device).unsqueeze(0)  # [1, T]
    return (positions <= first_eos.unsqueeze(1)).long(), ~has_eos


@contextlib.contextmanager
def generation_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode, no grad, gradient checkpointing off (it disables the KV cache), restored afterwards."""
    was_training = model.training
    name = (
        "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    checkpointing = getattr(model, name, False)
    if checkpointing:
        model.gradient_checkpointing_disable()
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: nn.Module) -> list[int]:
    """The tokenizer's EOS plus any extra EOS ids the model's generation config declares (e.g. <|im_end|>)."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(extra if isinstance(extra, list) else [extra] if extra is not None else [])
    return sorted(i for i in ids if i is not None)


def generate_rollout(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    num_generations: int,
    sampling: SamplingConfig,
    max_prompt_length: int | None = None,
    greedy: bool = False,
    synced_gpus: bool = False,
) -> Rollout:
    """Sample ``num_generations`` completions for each prompt in one batched ``generate`` call.

    Args:
        synced_gpus: keep every rank generating until all ranks are done (needed when weights are sharded).
    """
    device = next(model.parameters()).device
    prompt_ids, prompt_mask, num_truncated = tokenize_prompts(tokenizer, prompts, max_prompt_length)
    prompt_ids = prompt_ids.repeat_interleave(num_generations, dim=0).to(device)  # [N, P]
    prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0).to(device)  # [N, P]
    config = sampling.generation_config(tokenizer, greedy=greedy)
    eos_ids = eos_token_ids(tokenizer, model)
    config.eos_token_id = eos_ids
    with generation_mode(model):
        output = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            generation_config=config,
            synced_gpus=synced_gpus,
        )
    completion_ids = output[:, prompt_ids.shape[1] :]  # [N, T]
    return build_rollout(
        tokenizer, prompts, prompt_ids, prompt_mask, completion_ids, eos_ids, num_generations, num_truncated
    )


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
    width = max(int(completion_mask.sum(dim=1).max()), 1)  # trim columns that are padding in every row
    completion_ids, completion_mask = completion_ids[:, :width], completion_mask[:, :width]
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    repeated = [p for p in prompts for _ in range(group_size)]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(prompts[0]) else texts
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        is_truncated=is_truncated,
        prompts=repeated,
        completions=completions,
        group_size=group_size,
        num_truncated_prompts=num_truncated_prompts,
        sampling_logps=None if sampling_logps is None else sampling_logps[:, :width],
    )
