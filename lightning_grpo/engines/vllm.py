"""Prompts -> Rollout with a vLLM engine colocated in each training process (CUDA only, ``pip install vllm``).

Fast, but it samples from its own copy of the weights with its own kernels, so it reports the log-prob of each
sampled token; the trainer re-weights the loss by ``exp(policy logp - sampler logp)`` (``sampling_correction``),
as TRL does. Weights are copied into the engine after each training step, before the next generation.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_grpo.model.loading import cuda_package_problems
from lightning_grpo.model.policy import Policy
from lightning_grpo.rollout import RolloutEngine, SamplingConfig, sampled_rollout, tokenize_prompts
from lightning_grpo.types import Prompt, Rollout


class VLLMColocate(RolloutEngine):
    """A vLLM engine on this rank's GPU, sharing it with training.

    Built in ``setup`` inside each training process once ``torch.distributed`` is up, with ``RANK``,
    ``LOCAL_RANK`` and ``WORLD_SIZE`` set: the "external launcher" backend then runs one engine per process.
    Refused when constructed (at config time, before any model loads) where vLLM or a GPU is missing.

    Args:
        gpu_memory_utilization: the fraction of each GPU the engine may take (weights, KV cache).
        max_model_len: the longest prompt + completion; ``None`` takes the model's.
    """

    def __init__(self, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None) -> None:
        problems = cuda_package_problems("vllm", "vLLM engines")
        if problems:
            raise ValueError(
                f"rollout_engine VLLMColocate cannot run on this machine: {'; '.join(problems)}. "
                "Use rollout_engine: lightning_grpo.engines.HFGenerate (the default)"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        self.gpu_memory_utilization, self.max_model_len = gpu_memory_utilization, max_model_len
        self.llm: Any = None

    @override
    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        if self.llm is not None:
            return
        if policy.name_or_path is None or policy.is_lora:
            raise ValueError("rollout_engine VLLMColocate needs `model` as a name or path, and no peft_config")
        import os

        from vllm import LLM

        from lightning_grpo.model.loading import resolve_pretrained

        ranks = {"RANK": trainer.global_rank, "LOCAL_RANK": trainer.local_rank, "WORLD_SIZE": trainer.world_size}
        os.environ.update({k: str(v) for k, v in ranks.items()})
        self.llm = LLM(
            model=resolve_pretrained(policy.name_or_path),
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            distributed_executor_backend="external_launcher",  # one engine inside each training process
            seed=seed + trainer.global_rank,
            logprobs_mode="processed_logprobs",  # log-probs after temperature, like the trainer's
        )

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
        from vllm import SamplingParams

        tokenizer = policy.tokenizer
        prompt_ids, prompt_mask, num_truncated = tokenize_prompts(tokenizer, prompts, sampling)
        requests = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in zip(prompt_ids, prompt_mask)]
        params = SamplingParams(
            n=num_generations,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or -1,
            min_p=sampling.min_p or 0.0,
            repetition_penalty=sampling.repetition_penalty,
            max_tokens=sampling.max_completion_length,
            logprobs=0,  # the sampled token's own log-prob
            **(sampling.generation_kwargs or {}),
        )
        outputs = [c for request in self.llm.generate(requests, params, use_tqdm=False) for c in request.outputs]
        logps = [[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)] for c in outputs]
        completions = [list(c.token_ids) for c in outputs]
        return sampled_rollout(
            policy, prompts, prompt_ids, prompt_mask, completions, logps, num_generations, num_truncated
        )

    @override
    def sync_weights(self, policy: Policy) -> None:
        engine_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        with torch.no_grad():
            engine_model.load_weights((name, param.detach()) for name, param in policy.model.state_dict().items())
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights
