"""The dataclasses passed between stages. Holds no logic beyond shape bookkeeping.

Dimensions used across the package:
    B  prompts in a step on one rank (the data module's ``batch_size``)
    G  completions per prompt (``num_generations``)
    N  completions in a step on one rank, ``B * G``
    P  prompt length in tokens (left-padded)
    T  completion length in tokens (right-padded, trimmed to the longest completion)
    F  reward functions
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

Prompt = str | list[dict[str, Any]]  # plain text, or chat messages [{"role": ..., "content": ...}]


@dataclass  # not frozen: Lightning's batch transfer rejects frozen dataclasses
class PromptBatch:
    """B prompts and every other dataset column, as the data module yields them."""

    prompts: list[Prompt]  # [B]
    columns: dict[str, list[Any]] = field(default_factory=dict)  # name -> [B] values

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class Rollout:
    """G sampled completions for each of B prompts, grouped: rows ``g*G .. g*G+G-1`` share a prompt."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P] 1 on real prompt tokens
    completion_ids: Tensor  # [N, T] right-padded
    completion_mask: Tensor  # [N, T] 1 up to and including the first EOS
    is_truncated: Tensor  # [N] bool, True where no EOS was emitted within max_completion_length
    prompts: list[Prompt]  # [N] each prompt repeated G times
    completions: list[Any]  # [N] decoded text, or [{"role": "assistant", "content": text}] for chat prompts
    group_size: int  # G
    num_truncated_prompts: int = 0  # of the B prompts, how many lost tokens to max_prompt_length
    sampling_logps: Tensor | None = None  # [N, T] the sampler's log-probs when it is not the policy (vLLM)

    @cached_property  # built once: every log-prob pass reads it per micro-batch; fields are never mutated
    def input_ids(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @cached_property
    def attention_mask(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


@dataclass
class RewardScores:
    """What every reward function said about every completion."""

    per_function: Tensor  # [N, F] float, NaN where a function returned None ("not applicable")
    names: list[str]  # [F]
    weights: Tensor  # [F]
    errors: dict[str, int] = field(default_factory=dict)  # failed rows per function (on_reward_error skip/zero)

    @property
    def total(self) -> Tensor:
        """[N] weighted sum over functions, NaN where every function returned None."""
        total = (self.per_function * self.weights).nansum(dim=1)
        return torch.where(self.per_function.isnan().all(dim=1), torch.nan, total)
