"""Decoding engines: prompts -> Rollout sampled by the policy itself, in the training process. ``LeanDecode`` (the
default) runs its own sampling loop over the policy's forward and KV cache (``lean``), with fused and packed decode
steps where the model allows (``fused``, ``packing``) and ``generate``'s logit filters (``sampling``); ``HFGenerate``
(``hf``) calls Hugging Face ``generate``. Both sample the trained weights, so no weight sync is needed.
"""

from lightning_grpo.engines.decode.hf import HFGenerate
from lightning_grpo.engines.decode.lean import LeanDecode

__all__ = ["HFGenerate", "LeanDecode"]
