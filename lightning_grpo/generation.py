"""Generation backends: prompts -> Rollout, behind one small interface. Knows samplers; nothing about rewards.

- ``hf`` (default): Hugging Face ``generate`` on the policy itself; always in step with the weights, and
  under FSDP every rank keeps stepping until all are done (``synced_gpus``).
- ``vllm``: a colocated vLLM engine per rank (CUDA only, ``pip install vllm``). Fast, but it samples from
  its own copy of the weights with its own kernels, so it reports the log-prob of each sampled token; the
  trainer re-weights the loss by ``exp(policy logp - sampler logp)`` (``sampling_correction``), as TRL does.
  Weights are copied into the engine after each training step, before the next generation.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout import (
    Prompt,
    SamplingConfig,
    build_rollout,
    eos_token_ids,
    generate_rollout,
    tokenize_prompts,
)
from lightning_grpo.types import Rollout


class Generator(Protocol):
    def generate(
        self,
        policy: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        prompts: list[Prompt],
        num_generations: int,
        sampling: SamplingConfig,
        max_prompt_length: int | None,
        greedy: bool,
        synced_gpus: bool,
    ) -> Rollout: ...

    def sync_weights(self, policy: nn.Module) -> None:
        """Make the next generation use ``policy``'s current weights."""


class HFGenerator:
    """``policy.generate``: one batched call for all B * G completions."""

    def generate(self, policy, tokenizer, prompts, num_generations, sampling, max_prompt_length, greedy, synced_gpus):
        return generate_rollout(
            policy, tokenizer, prompts, num_generations, sampling, max_prompt_length, greedy, synced_gpus
        )

    def sync_weights(self, policy: nn.Module) -> None:
        pass  # generates with the policy itself


class VLLMGenerator:
    """A colocated vLLM engine on this rank's GPU, sharing it with training (``gpu_memory_utilization``).

    Built inside each training process after ``torch.distributed`` is up, with ``RANK``, ``LOCAL_RANK`` and
    ``WORLD_SIZE`` set: the "external launcher" backend then runs one engine per process in the same group.

    Args:
        model: the policy's Hugging Face name or local path (the engine loads it once; weights then follow).
        gpu_memory_utilization: the fraction of GPU memory vLLM may take (weights, KV cache).
        max_model_len: the longest prompt + completion; ``None`` takes the model's.
        seed: sampling seed of this rank's engine.
    """

    def __init__(self, model: str, gpu_memory_utilization: float, max_model_len: int | None, seed: int) -> None:
        from vllm import LLM

        self.llm = LLM(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            distributed_executor_backend="external_launcher",  # one engine inside each training process
            seed=seed,
            logprobs_mode="processed_logprobs",  # log-probs after temperature, like the trainer's
        )

    def generate(self, policy, tokenizer, prompts, num_generations, sampling, max_prompt_length, greedy, synced_gpus):
        from vllm import SamplingParams

        prompt_ids, prompt_mask, num_truncated = tokenize_prompts(tokenizer, prompts, max_prompt_length)
        requests = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in zip(prompt_ids, prompt_mask)]
        params = SamplingParams(
            n=1 if greedy else num_generations,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or -1,
            min_p=sampling.min_p or 0.0,
            repetition_penalty=sampling.repetition_penalty,
            max_tokens=sampling.max_completion_length,
            logprobs=0,  # the sampled token's own log-prob
        )
        outputs = [c for request in self.llm.generate(requests, params, use_tqdm=False) for c in request.outputs]
        device = next(policy.parameters()).device
        width = max(max(len(c.token_ids) for c in outputs), 1)
        completion_ids = torch.full((len(outputs), width), tokenizer.pad_token_id, dtype=torch.long)
        sampling_logps = torch.zeros(len(outputs), width)
        for i, c in enumerate(outputs):
            completion_ids[i, : len(c.token_ids)] = torch.tensor(c.token_ids)
            sampling_logps[i, : len(c.token_ids)] = torch.tensor(
                [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]
            )
        group = 1 if greedy else num_generations
        return build_rollout(
            tokenizer,
            prompts,
            prompt_ids.repeat_interleave(group, 0).to(device),
            prompt_mask.repeat_interleave(group, 0).to(device),
            completion_ids.to(device),
            eos_token_ids(tokenizer, policy),
            group,
            num_truncated,
            sampling_logps.to(device),
        )

    def sync_weights(self, policy: nn.Module) -> None:
        engine_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        with torch.no_grad():
            engine_model.load_weights((name, param.detach()) for name, param in policy.state_dict().items())
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights


GENERATION_BACKENDS = ("hf", "vllm")
