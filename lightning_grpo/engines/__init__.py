"""Rollout engines: implementations of ``lightning_grpo.rollout.RolloutEngine``, chosen by ``class_path``.

- ``HFGenerate`` (default): Hugging Face ``generate`` on the policy itself.
- ``VLLMColocate``: a vLLM engine inside each training process (CUDA, ``pip install vllm``).
"""

from lightning_grpo.engines.hf import HFGenerate
from lightning_grpo.engines.vllm import VLLMColocate

__all__ = ["HFGenerate", "VLLMColocate"]
