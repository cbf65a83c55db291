"""Prompts -> Rollout with Hugging Face ``generate`` on the policy itself: always in step with the weights.

One batched call for all B*G completions, KV cache on. Under sharding every rank keeps stepping until all
are done (``synced_gpus``), so ranks whose completions end early do not deadlock the others.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_grpo.policy import Policy
from lightning_grpo.rollout import RolloutEngine, SamplingConfig, build_rollout, tokenize_prompts
from lightning_grpo.types import Prompt, Rollout


class HFGenerate(RolloutEngine):
    """``policy.model.generate``: one batched call for all B * G completions."""

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
        tokenizer, device = policy.tokenizer, policy.device
        prompt_ids, prompt_mask, num_truncated = tokenize_prompts(tokenizer, prompts, sampling)
        prompt_ids = prompt_ids.repeat_interleave(num_generations, dim=0).to(device)  # [N, P]
        prompt_mask = prompt_mask.repeat_interleave(num_generations, dim=0).to(device)  # [N, P]
        config = sampling.generation_config(tokenizer, greedy=greedy)
        config.eos_token_id = policy.eos_token_ids
        with policy.generating() as model:
            output = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                generation_config=config,
                synced_gpus=policy.synced_generation,
            )
        completion_ids = output[:, prompt_ids.shape[1] :]  # [N, T]
        return build_rollout(
            tokenizer,
            prompts,
            prompt_ids,
            prompt_mask,
            completion_ids,
            config.eos_token_id,
            num_generations,
            num_truncated,
        )
