"""Prompts -> Rollout by a user's own function (TRL 1.16's ``rollout_func``): for users who own the interaction.

Knows the Rollout's layout; nothing about how the function generates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from lightning_grpo.engines.base import RolloutEngine
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.multiturn.calls import resolve_tool
from lightning_grpo.engines.prompts import is_conversational
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import Prompt, Rollout

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


@dataclass
class RolloutContext:
    """What ``rollout_func`` gets as its second argument (TRL passes the trainer; these are the attributes a
    rollout function reads from it)."""

    policy: Policy
    num_generations: int
    sampling: SamplingConfig
    greedy: bool
    columns: dict[str, list[Any]]

    @property
    def model(self) -> Any:
        return self.policy.model

    @property
    def processing_class(self) -> Any:
        return self.policy.tokenizer


class RolloutFunction(RolloutEngine):
    """``rollout_func(prompts, context) -> {"prompt_ids", "completion_ids", "logprobs", ...}`` (TRL's contract).

    The function gets this rank's B prompts, once each, and returns ``num_generations`` completions per prompt
    in grouped order: lists of N token-id lists. ``logprobs`` (per completion token, or ``None``) are the
    sampler's, used for ``sampling_correction``; an optional ``env_mask`` (1 on tokens the model wrote) becomes the
    ``tool_mask``; every other key is a per-completion column for the reward functions.

    Args:
        rollout_func: the callable, or its import path.
    """

    def __init__(self, rollout_func: Callable | str) -> None:
        self.rollout_func = resolve_tool(rollout_func, "rollout_func")

    @override
    def reward_columns(self) -> None:
        return None  # the rollout_func's extra fields: known once it returns

    @override
    def generate(
        self,
        policy: Policy,
        prompts: list[Prompt],
        num_generations: int,
        sampling: SamplingConfig,
        greedy: bool,
        columns: dict[str, list[Any]] | None = None,
    ) -> Rollout:
        context = RolloutContext(policy, num_generations, sampling, greedy, dict(columns or {}))
        with policy.generating():
            output = self.rollout_func(list(prompts), context)
        missing = [k for k in REQUIRED if k not in output]
        if missing:
            raise ValueError(f"rollout_func must return the keys {list(REQUIRED)}; {missing} missing")
        n = len(prompts) * num_generations
        if len(output["completion_ids"]) != n or len(output["prompt_ids"]) != n:
            raise ValueError(
                f"rollout_func must return num_generations ({num_generations}) completions per prompt, {n} in all, "
                f"got {len(output['completion_ids'])} completion_ids and {len(output['prompt_ids'])} prompt_ids"
            )
        extra = {k: list(v) for k, v in output.items() if k not in (*REQUIRED, "env_mask")}
        return _rollout(policy, prompts, output, num_generations, extra)


def _rollout(policy: Policy, prompts: list[Prompt], output: dict, group_size: int, extra: dict) -> Rollout:
    tokenizer, eos = policy.tokenizer, policy.eos_token_ids
    texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
    return Rollout.from_token_lists(
        output["prompt_ids"],
        output["completion_ids"],
        tokenizer.pad_token_id,
        is_truncated=[not ids or ids[-1] not in eos for ids in output["completion_ids"]],
        sampling_logps=output["logprobs"],
        tool_mask=output.get("env_mask"),
        device=policy.device,
        prompts=[p for p in prompts for _ in range(group_size)],
        completions=[[{"role": "assistant", "content": t}] for t in texts] if is_conversational(prompts[0]) else texts,
        group_size=group_size,
        columns=extra,
    )
