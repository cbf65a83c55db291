"""Prompts -> a Rollout: what every rollout engine shares (prompt tokenisation, masks after EOS, Rollout
building). Knows the policy and its tokenizer; nothing about rewards or losses.

The engine interface, ``RolloutEngine``, is ``lightning_grpo.engines.base`` (still importable from here); the
engines are ``lightning_grpo.engines``, chosen by ``class_path`` (``rollout_engine:`` in YAML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationConfig, PreTrainedTokenizerBase

from lightning_grpo.checks import field_help, raise_problems
from lightning_grpo.images import open_image
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import HostRows, Prompt, Rollout, pad_rows


@field_help
@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled, TRL's names; every engine honours all of them. ``sampling:`` in YAML."""

    temperature: float = 1.0
    """Sampling temperature (> 0); log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = 0
    """Top-k sampling; 0 disables it."""
    min_p: float | None = None
    """Min-p sampling; ``None`` disables it."""
    repetition_penalty: float = 1.0
    """1.0 disables it."""
    max_completion_length: int = 256
    """Most tokens sampled per completion. Tool episodes: every token the model wrote."""
    max_prompt_length: int | None = 512
    """Longer prompts keep their last tokens; ``None``: all. Counted in ``train/truncated_prompts``; TRL 1.16 has
    no such limit."""
    generation_kwargs: dict[str, Any] | None = None
    """More arguments of the engine's sampler. ``transformers.GenerationConfig`` for Hugging Face ``generate``,
    ``vllm.SamplingParams`` for vLLM: ``{no_repeat_ngram_size: 3}``."""
    chat_template_kwargs: dict[str, Any] | None = None
    """More arguments of the tokenizer's chat template for chat prompts. Qwen3's ``{enable_thinking: false}``."""

    def __post_init__(self) -> None:
        checks = [
            (self.temperature > 0, f"sampling.temperature must be > 0, got {self.temperature!r}"),
            (0 < self.top_p <= 1, f"sampling.top_p must be in (0, 1], got {self.top_p!r}"),
            (self.top_k >= 0, f"sampling.top_k must be >= 0 (0 disables it), got {self.top_k!r}"),
            (
                self.min_p is None or 0 <= self.min_p <= 1,
                f"sampling.min_p must be None or in [0, 1], got {self.min_p!r}",
            ),
            (self.repetition_penalty > 0, f"sampling.repetition_penalty must be > 0, got {self.repetition_penalty!r}"),
            (
                self.max_completion_length >= 1,
                f"sampling.max_completion_length must be >= 1, got {self.max_completion_length!r}",
            ),
            (
                self.max_prompt_length is None or self.max_prompt_length >= 1,
                f"sampling.max_prompt_length must be None or >= 1, got {self.max_prompt_length!r}",
            ),
        ]
        raise_problems("sampling", checks)

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
            **(self.generation_kwargs or {}),
        )


def is_conversational(prompt: Prompt) -> bool:
    return isinstance(prompt, list)


def render_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], chat_template_kwargs: dict[str, Any] | None = None
) -> list[str]:
    """Chat messages go through the tokenizer's chat template (TRL's ``maybe_apply_chat_template``, with
    ``chat_template_kwargs``); plain text is used as is."""
    if not is_conversational(prompts[0]):
        return list(prompts)
    if tokenizer.chat_template is None:
        raise ValueError(
            "prompts are chat messages but the tokenizer has no chat_template: give plain-text prompts or a "
            "tokenizer with a chat template"
        )
    from trl.data_utils import maybe_apply_chat_template  # pyarrow and datasets: only for chat prompts

    kwargs = chat_template_kwargs or {}
    return [maybe_apply_chat_template({"prompt": p}, tokenizer, **kwargs)["prompt"] for p in prompts]


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], sampling: SamplingConfig
) -> list[list[int]]:
    """The token ids of each prompt as the policy reads it (chat template applied), before any cut."""
    texts = render_prompts(tokenizer, prompts, sampling.chat_template_kwargs)
    return tokenizer(texts, add_special_tokens=not is_conversational(prompts[0]))["input_ids"]


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], sampling: SamplingConfig
) -> tuple[Tensor, Tensor, int]:
    """Left-padded [B, P] ids and mask; prompts longer than ``sampling.max_prompt_length`` keep their last tokens."""
    encoded = encode_prompts(tokenizer, prompts, sampling)
    limit = sampling.max_prompt_length
    too_long = [ids for ids in encoded if limit and len(ids) > limit]
    if limit:
        encoded = [ids[-limit:] for ids in encoded]
    ids, mask = pad_rows(encoded, tokenizer.pad_token_id, left=True)
    return ids, mask, len(too_long)


PER_TOKEN_VISION = ("token_type_ids", "mm_token_type_ids")  # per-token fields (Gemma 3 ...): not carried yet


def tokenize_image_prompts(
    processor: Any, prompts: list[Prompt], images: list[list[Any]], sampling: SamplingConfig
) -> tuple[Tensor, Tensor, dict[str, list[Tensor]]]:
    """Left-padded [B, P] ids (the processor's image tokens in them) and mask, and the vision inputs of each prompt
    (name -> [B] tensors, its images along dim 0), each prompt processed with its own images as TRL 1.16 does
    (``prepare_multimodal_messages``, then the processor's chat template). A prompt is never cut: cutting would
    drop image tokens that its images fill."""
    from trl.data_utils import prepare_multimodal_messages

    encoded, vision = [], {}
    for prompt, row in zip(prompts, images):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        messages = prepare_multimodal_messages(messages, images=[open_image(x) for x in row])
        out = processor.apply_chat_template(
            [messages],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            **(sampling.chat_template_kwargs or {}),
        )
        encoded.append(out["input_ids"][0].tolist())
        for name, value in out.items():
            if name in PER_TOKEN_VISION:
                raise ValueError(
                    f"the processor returns per-token {name!r}: such vision-language models are not supported yet"
                )
            if name not in ("input_ids", "attention_mask") and isinstance(value, Tensor):
                vision.setdefault(name, []).append(value)
    _check_image_prompts(encoded, vision, sampling.max_prompt_length)
    ids, mask = pad_rows(encoded, processor.tokenizer.pad_token_id, left=True)
    return ids, mask, vision


def _check_image_prompts(encoded: list[list[int]], vision: dict[str, list[Tensor]], limit: int | None) -> None:
    longest = max(len(ids) for ids in encoded)
    if limit and longest > limit:
        raise ValueError(
            f"a prompt with images is {longest} tokens (its image tokens included), longer than "
            f"sampling.max_prompt_length={limit}, and cutting it would drop image tokens: raise it or set it to null"
        )
    if any(len(per_row) != len(encoded) for per_row in vision.values()):
        raise ValueError("a batch mixes prompts with and without images: give every row of an image dataset an image")


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


def __getattr__(name: str) -> Any:
    """``RolloutEngine`` and ``Sampled`` where users imported them before they moved to ``engines/base.py``."""
    if name in ("RolloutEngine", "Sampled"):
        from lightning_grpo.engines import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
